//! The README's example of loading qcli's output in Burn, compiled and run by tests/io/test_burn.py.
//!
//! `qcli quantize model.safetensors --transpose` wrote `up` and `down` as `[d_input, d_output]`, the layout
//! of Burn's default `LinearLayout::Row`; without `--transpose` they are PyTorch's `[d_output, d_input]`,
//! which `LinearLayout::Col` reads. The run's last lines name the layout the file needs.

use burn::nn::{Linear, LinearConfig, LinearLayout};
use burn::prelude::*;
use burn_store::{BurnpackStore, ModuleSnapshot};

#[derive(Module, Debug)]
struct Mlp {
    up: Linear,
    down: Linear,
}

/// A Linear for a weight qcli wrote: `[d_input, d_output]` with `--transpose` (Burn's default
/// `LinearLayout::Row`), else PyTorch's `[d_output, d_input]` (`LinearLayout::Col`).
fn linear(d_input: usize, d_output: usize, transposed: bool, device: &Device) -> Linear {
    let config = LinearConfig::new(d_input, d_output);
    if transposed {
        config.init(device)
    } else {
        config.with_layout(LinearLayout::Col).init(device)
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: load_qcli MODEL.bpk [row|col]");
    // row (the default) for a file `qcli quantize --transpose` wrote, col for one written without it
    let transposed = args.next().as_deref() != Some("col");
    let device = Device::flex(); // or Device::wgpu(DeviceKind::DefaultDevice)
    let mut model = Mlp {
        up: linear(256, 128, transposed, &device),
        down: linear(128, 64, transposed, &device),
    };
    // The weights stay quantized (QFloat) in the module; Burn dequantizes them as it computes.
    model
        .load_from(&mut BurnpackStore::from_file(&path))
        .expect("a qcli file loads like any burnpack");

    let x = Tensor::<2>::ones([1, 256], &device);
    let y = model.down.forward(model.up.forward(x));
    println!("{:?}", y.dims());
}
