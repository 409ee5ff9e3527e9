//! docs/output.md's example of loading a sharded qcli output into one module, compiled and run by
//! tests/io/test_burn_shards.py.
//!
//! `qcli quantize model.safetensors --recipe row.toml --max-shard-size SIZE -o DIR/` wrote `up` and
//! `down` in shards beside `DIR/model.bpk.index.json`. Burn reads no index and each shard holds only some
//! of the module's parameters, so each is loaded with `allow_partial(true)` and the parameters they filled
//! are checked against the module's own list afterwards.

use std::collections::BTreeSet;
use std::path::Path;

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn_store::{BurnpackStore, ModuleSnapshot};

#[derive(Module, Debug)]
struct Mlp {
    up: Linear,
    down: Linear,
}

fn main() {
    let index = std::env::args().nth(1).expect("usage: load_sharded MODEL.bpk.index.json");
    let device = Device::flex(); // or Device::wgpu(DeviceKind::DefaultDevice)
    let mut model = Mlp {
        up: LinearConfig::new(256, 128).init(&device),
        down: LinearConfig::new(128, 64).init(&device),
    };
    // The index's weight_map names each shard; they sit beside it.
    let text = std::fs::read_to_string(&index).expect("the index reads");
    let map: serde_json::Value = serde_json::from_str(&text).expect("the index is JSON");
    let shards: BTreeSet<&str> = map["weight_map"].as_object().expect("a weight_map").values()
        .map(|shard| shard.as_str().expect("a shard's file name"))
        .collect();
    let folder = Path::new(&index).parent().expect("the index's folder");
    let mut filled = BTreeSet::new();
    for shard in shards {
        // allow_partial: the parameters this shard does not hold are left for the others.
        let mut store = BurnpackStore::from_file(folder.join(shard)).allow_partial(true);
        let loaded = model.load_from(&mut store).expect("each shard loads like any burnpack");
        filled.extend(loaded.applied);
    }
    // allow_partial also lets a parameter no shard holds keep its random init: check each was filled.
    let missing: Vec<String> = model.collect(None, None, false).into_iter()
        .map(|tensor| tensor.name)
        .filter(|name| !filled.contains(name))
        .collect();
    assert!(missing.is_empty(), "no shard filled {missing:?}");

    let x = Tensor::<2>::ones([1, 256], &device);
    let y = model.down.forward(model.up.forward(x));
    println!("{:?}", y.into_data().try_to_vec::<f32>().expect("f32 output"));
}
