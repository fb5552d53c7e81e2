//! Placeholder: this backend is being written; see the crate description.
