//! The Burn backends the harness loads files on, by the names qcli's `--burn-backend` uses.

use burn::prelude::*;

/// The device of backend `name`: Burn's pure-Rust CPU backend (`flex`), the deprecated ndarray
/// backend, or the CubeCL wgpu backend (on the CPU through a Vulkan driver such as lavapipe).
#[allow(deprecated)] // ndarray is deprecated in 0.22 but still shipped; its users load files too
pub fn device(name: &str) -> Result<Device, String> {
    match name {
        "flex" => Ok(Device::flex()),
        "ndarray" => Ok(Device::ndarray()),
        "wgpu" => Ok(Device::wgpu(DeviceKind::DefaultDevice)),
        other => Err(format!("unknown backend {other:?}")),
    }
}
