//! In-process end-to-end tests of the HBONE data path: two gateways on
//! loopback, real TLS, real HTTP/2, real sockets.

mod admin;
mod drains;
mod integrity;
mod lifecycle;
mod policies;
mod pool;
mod rejections;
