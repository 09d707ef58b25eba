//! Devices, streams, events and asynchronous host<->device copies for longshore.
//!
//! This crate is filled by the transfer-engine issue; it holds no functionality yet.
