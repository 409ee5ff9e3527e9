//! A stack of `nn::Linear` layers: loaded from a qcli file with `load_from` and run forward, or saved
//! with `BurnpackStore` as a fixture, its weights quantized by Burn's own quantizer.
//!
//! Its tensors are `layers.{i}.weight` and, where present, `layers.{i}.bias`. With
//! `LinearLayout::Row` a weight is `[d_input, d_output]`; with `Col` it is `[d_output, d_input]`.

use std::path::Path;

use burn::module::{Param, ParamId};
use burn::nn::{Linear, LinearConfig, LinearLayout};
use burn::prelude::*;
use burn::tensor::quantization::{Calibration, QuantScheme, compute_q_params, compute_range};
use burn_store::{BurnpackStore, ModuleSnapshot, ModuleStore};

use crate::tensors;

#[derive(Module, Debug)]
pub struct LinearStack {
    layers: Vec<Linear>,
}

pub fn layout(name: &str) -> Result<LinearLayout, String> {
    match name {
        "row" => Ok(LinearLayout::Row),
        "col" => Ok(LinearLayout::Col),
        other => Err(format!("--layout is row or col, not {other:?}")),
    }
}

/// The shape of each layer's weight and whether it has a bias, read from the file's tensors.
fn layer_shapes(store: &mut BurnpackStore) -> Result<Vec<([usize; 2], bool)>, String> {
    let tensors = store.get_all_tensors().map_err(|err| err.to_string())?;
    let mut layers = Vec::new();
    while let Some(weight) = tensors.get(&format!("layers.{}.weight", layers.len())) {
        let [rows, cols] = weight.shape.to_vec()[..] else {
            return Err(format!("layers.{}.weight is not 2-D", layers.len()));
        };
        let bias = tensors.contains_key(&format!("layers.{}.bias", layers.len()));
        layers.push(([rows, cols], bias));
    }
    if layers.is_empty() {
        return Err("the file has no layers.0.weight".into());
    }
    Ok(layers)
}

/// A stack shaped after the file's weights, with freshly initialised parameters.
fn shaped_like(
    store: &mut BurnpackStore,
    layout: LinearLayout,
    device: &Device,
) -> Result<LinearStack, String> {
    let layers = layer_shapes(store)?
        .into_iter()
        .map(|([rows, cols], bias)| {
            let (d_input, d_output) = match layout {
                LinearLayout::Row => (rows, cols),
                LinearLayout::Col => (cols, rows),
            };
            LinearConfig::new(d_input, d_output)
                .with_bias(bias)
                .with_layout(layout)
                .init(device)
        })
        .collect();
    Ok(LinearStack { layers })
}

/// Loads `weights` into a stack with `load_from`, runs `x` (from `input`) through it, writes `y`.
pub fn forward(
    device: &Device,
    layout: LinearLayout,
    weights: &Path,
    input: &Path,
    output: &Path,
) -> Result<(), String> {
    let mut stack = shaped_like(&mut BurnpackStore::from_file(weights), layout, device)?;
    stack
        .load_from(&mut BurnpackStore::from_file(weights))
        .map_err(|err| format!("{}: {err}", weights.display()))?;

    let (_, x) = tensors::read_f32(input)?
        .into_iter()
        .find(|(name, _)| name == "x")
        .ok_or(format!("{} has no tensor x", input.display()))?;
    let mut y = Tensor::<2>::from_data(x, device);
    for layer in &stack.layers {
        y = layer.forward(y);
    }
    let shape = y.dims().to_vec();
    crate::report::write_f32(
        output,
        &[("y".to_string(), shape, tensors::into_f32(y.into_data())?)],
    )
}

/// Saves the `layers.{i}.weight` (given as `[d_input, d_output]`) and `layers.{i}.bias` tensors of
/// `input` as a stack with `BurnpackStore`, each weight quantized first by Burn's own quantizer when a
/// scheme is given (min-max calibration, as `Quantizer` does); biases stay f32. Parameter ids count up
/// from 0 in file order, so the same input gives the same bytes.
pub fn write_fixture(
    device: &Device,
    scheme: Option<QuantScheme>,
    input: &Path,
    output: &Path,
) -> Result<(), String> {
    let source = tensors::read_f32(input)?;
    let tensor = |name: String| {
        source
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, data)| data.clone())
    };
    let mut ids = (0..).map(ParamId::from);
    let mut layers = Vec::new();
    while let Some(weight) = tensor(format!("layers.{}.weight", layers.len())) {
        let bias = tensor(format!("layers.{}.bias", layers.len()));
        let mut weight = Tensor::<2>::from_data(weight, device);
        if let Some(scheme) = &scheme {
            let range = compute_range(scheme, &weight, &Calibration::MinMax);
            weight = weight.quantize(scheme, compute_q_params(scheme, range));
        }
        let weight = Param::initialized(ids.next().expect("unbounded"), weight);
        let bias = bias.map(|bias| {
            Param::initialized(
                ids.next().expect("unbounded"),
                Tensor::<1>::from_data(bias, device),
            )
        });
        layers.push(Linear { weight, bias });
    }
    let mut store = BurnpackStore::from_file(output).overwrite(true);
    LinearStack { layers }
        .save_into(&mut store)
        .map_err(|err| format!("{}: {err}", output.display()))
}
