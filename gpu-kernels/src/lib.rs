//! Kernel sources shared by the CUDA and ROCm backends (being written).
