//! Support shared by the operator's integration tests; each test binary uses a part of it.
#![allow(dead_code, unused_macros, unused_imports)]

pub mod fake_apiserver;
pub mod helm;
