//! Debian kernels for the test VM, downloaded once into a cache.
