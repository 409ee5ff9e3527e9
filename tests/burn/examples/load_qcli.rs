//! The README's example of loading qcli's output in Burn, compiled and run by tests/io/test_burn.py.
//!
//! `qcli quantize model.safetensors --recipe row.toml --burn-backend flex` wrote `up` and `down` as
//! `[d_input, d_output]` (`transpose = true`), the layout of Burn's default `LinearLayout::Row`.

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn_store::{BurnpackStore, ModuleSnapshot};

#[derive(Module, Debug)]
struct Mlp {
    up: Linear,
    down: Linear,
}

fn main() {
    let path = std::env::args().nth(1).expect("usage: load_qcli MODEL.bpk");
    let device = Device::flex(); // or Device::wgpu(DeviceKind::DefaultDevice)
    let mut model = Mlp {
        up: LinearConfig::new(256, 128).init(&device),
        down: LinearConfig::new(128, 64).init(&device),
    };
    // The weights stay quantized (QFloat) in the module; Burn dequantizes them as it computes.
    model
        .load_from(&mut BurnpackStore::from_file(&path))
        .expect("a qcli file loads like any burnpack");

    let x = Tensor::<2>::ones([1, 256], &device);
    let y = model.down.forward(model.up.forward(x));
    println!("{:?}", y.dims());
}
