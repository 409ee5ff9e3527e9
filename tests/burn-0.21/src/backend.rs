//! The Burn 0.21 backends the harness loads files on, by the names qcli's `--burn-backend` uses, and
//! `cuda`, built only with the crate's `cuda` feature.
//!
//! Burn 0.21 has no backend-erased `Device`: every tensor is `Tensor<B, D>` for a backend type `B`,
//! so a command is run once, generic over `B`, with the backend picked by name.

#[cfg(feature = "cuda")]
use burn::backend::Cuda;
use burn::backend::{Flex, NdArray, Wgpu};
use burn::tensor::backend::Backend;

/// The backend names this build has, for the usage.
#[cfg(feature = "cuda")]
pub const NAMES: &str = "flex, ndarray, wgpu, cuda";
#[cfg(not(feature = "cuda"))]
pub const NAMES: &str = "flex, ndarray, wgpu (cuda: a build with --features cuda)";

/// The backends by name: Burn's pure-Rust CPU backend (`flex`), the ndarray backend, the CubeCL
/// wgpu backend (on the CPU through a Vulkan driver such as lavapipe), or the CubeCL CUDA backend.
pub enum Name {
    Flex,
    NdArray,
    Wgpu,
    #[cfg(feature = "cuda")]
    Cuda,
}

pub fn parse(name: &str) -> Result<Name, String> {
    match name {
        "flex" => Ok(Name::Flex),
        "ndarray" => Ok(Name::NdArray),
        "wgpu" => Ok(Name::Wgpu),
        #[cfg(feature = "cuda")]
        "cuda" => Ok(Name::Cuda),
        #[cfg(not(feature = "cuda"))]
        "cuda" => Err(
            "this harness was built without the cuda backend: build it with \
             `cargo build --features cuda` (see tests/burn-0.21/Cargo.toml)"
                .into(),
        ),
        other => Err(format!("unknown backend {other:?}")),
    }
}

/// A command generic over the backend, run on the backend named `name` and its default device.
pub trait Command {
    fn run<B: Backend>(self, device: &B::Device) -> Result<(), String>;
}

pub fn run(name: &Name, command: impl Command) -> Result<(), String> {
    match name {
        Name::Flex => command.run::<Flex>(&Default::default()),
        Name::NdArray => command.run::<NdArray>(&Default::default()),
        // The default wgpu device: the best adapter wgpu finds (lavapipe on a machine without a GPU).
        Name::Wgpu => command.run::<Wgpu>(&Default::default()),
        // The first CUDA device (index 0).
        #[cfg(feature = "cuda")]
        Name::Cuda => {
            let device = Default::default();
            open_cuda(&device)?;
            command.run::<Cuda>(&device)
        }
    }
}

/// Opens `device` with a tensor of one value, so that a machine without a GPU or its driver stops here
/// with one error rather than with a failed verdict per tensor. CubeCL opens the device on a thread of
/// its own, whose panic the caller sees only as a closed channel: the panics of every thread are kept
/// for the message.
#[cfg(feature = "cuda")]
fn open_cuda(device: &burn::backend::cuda::CudaDevice) -> Result<(), String> {
    use std::sync::{Arc, Mutex};

    let panics = Arc::new(Mutex::new(Vec::new()));
    let hook = std::panic::take_hook();
    let seen = panics.clone();
    std::panic::set_hook(Box::new(move |info| {
        seen.lock().unwrap().push(info.to_string())
    }));
    let opened = std::panic::catch_unwind(|| {
        burn::tensor::Tensor::<Cuda, 1>::zeros([1], device).into_data()
    });
    std::panic::set_hook(hook);
    match opened {
        Ok(_) => Ok(()),
        Err(_) => Err(format!(
            "the cuda backend could not open a device:\n{}",
            panics.lock().unwrap().join("\n")
        )),
    }
}
