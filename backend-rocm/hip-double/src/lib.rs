//! HIP runtime test double (being written).
