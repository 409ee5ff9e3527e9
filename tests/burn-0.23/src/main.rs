//! qcli's files in Burn 0.23.0-pre.1, the pre-release of Burn's next version: opens burnpack files the way
//! a Burn user does, on a chosen backend, and writes what Burn decoded as f32 safetensors. The
//! `dequantize`, `probe` and `compute` commands and their output are those of tests/burn (Burn 0.22.1).
//! Built with the `tile-kernels` feature, wgpu's matmul runs burn-cubecl's tile kernels only.
//!
//! ```text
//! burn-harness-023 dequantize --backend BACKEND IN.bpk OUT.safetensors
//! burn-harness-023 probe      --backend BACKEND IN.bpk OUT.safetensors    (one verdict per tensor)
//! burn-harness-023 compute    --backend BACKEND IN.bpk                 (one verdict per tensor and op)
//! burn-harness-023 version                                              (burn-store's, as linked)
//! ```
//!
//! 0.23's tensor, module and `TensorData` API is 0.22's for everything `compute` uses, so tests/burn's
//! src/compute.rs and src/tensors.rs are compiled here as they are, next to the common/ files; only the
//! backends (no ndarray) and the store's tensor type (decode.rs) are 0.23's own.

#[path = "../../burn/common/cli.rs"]
mod cli;
#[path = "../../burn/common/ops.rs"]
mod ops;
#[path = "../../burn/common/report.rs"]
mod report;

#[path = "../../burn/src/compute.rs"]
mod compute;
// `read_f32` serves tests/burn's fixtures and model commands, which this harness does not have.
#[allow(dead_code)]
#[path = "../../burn/src/tensors.rs"]
mod tensors;

mod backend;
mod decode;

use std::process::ExitCode;

use burn_store::BurnpackStore;

use crate::cli::{Args, Failure};

const USAGE: &str = "usage:
  burn-harness-023 dequantize --backend BACKEND IN.bpk OUT.safetensors
  burn-harness-023 probe --backend BACKEND IN.bpk OUT.safetensors
  burn-harness-023 compute --backend BACKEND IN.bpk
  burn-harness-023 version";

fn device(args: &Args) -> Result<burn::prelude::Device, Failure> {
    backend::device(args.option("backend")?).map_err(Failure::Usage)
}

fn run(args: &Args) -> Result<(), Failure> {
    match args.command.as_str() {
        "version" => {
            println!("{}", BurnpackStore::default_metadata()["version"]);
            Ok(())
        }
        "dequantize" => {
            let [input, output] = args.paths()?;
            Ok(decode::dequantize(&device(args)?, input, output)?)
        }
        "probe" => {
            let [input, output] = args.paths()?;
            Ok(decode::probe(&device(args)?, input, output)?)
        }
        "compute" => {
            let [input] = args.paths()?;
            Ok(compute::compute(&device(args)?, input)?)
        }
        other => Err(Failure::Usage(format!("unknown command {other:?}"))),
    }
}

fn main() -> ExitCode {
    let tile = if cfg!(feature = "tile-kernels") {
        "\nbuilt with tile-kernels: burn-cubecl's tile-kernels-only matmul"
    } else {
        ""
    };
    cli::main(&format!("{USAGE}\nbackends: {}{tile}", backend::NAMES), run)
}
