//! Host memory for longshore.
