//! The host bindings of the `tidegate:policy` WIT package, generated here and
//! nowhere else.

wasmtime::component::bindgen!({
    path: "../sdk/wit",
    world: "drain-policy",
});
