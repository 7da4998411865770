//! Measurement-based load balancing (being written).
