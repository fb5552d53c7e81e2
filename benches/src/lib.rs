//! Benchmark helpers shared by the criterion benches and `hisparse bench`.
