//! What a Burn model runs on a quantized weight: `Embedding` and `Linear` (Row and Col layout) forward,
//! and a matmul against a float activation, each on the QFloat tensor itself and on its `dequantize()`.
//!
//! One JSON line per 2-D quantized tensor and op: `{"name", "op", "ok", "error" | "max_abs", "max_ref"}`,
//! where `max_abs` is the largest difference between the two results and `max_ref` the largest value of
//! the dequantized one; qcli's side (bench/burn_sweep.py) holds them to its tolerance.

use std::path::Path;

use burn::module::{Param, ParamId};
use burn::nn::{Embedding, Linear};
use burn::prelude::*;
use burn::tensor::DType;

use crate::decode;
use crate::report;

/// The ops a model runs on a weight `[rows, cols]`, by the name the verdicts use.
const OPS: [&str; 4] = ["embedding", "linear-row", "linear-col", "matmul"];

/// A float activation of `shape` with values spread over [-1, 1), the same on every backend.
fn activation<const D: usize>(shape: [usize; D], device: &Device) -> Tensor<D> {
    let count = shape.iter().product::<usize>();
    let values = (0..count)
        .map(|i| (i * 7919 % 1000) as f32 / 500.0 - 1.0)
        .collect::<Vec<_>>();
    Tensor::<1>::from_data(TensorData::new(values, [count]), device).reshape(shape)
}

/// `op` run on `weight` (quantized or float), as Burn's modules run it; Col loads a `[d_output, d_input]`
/// weight transposed, as `LinearLayout::Col`'s load mapper does.
fn run(op: &str, weight: Tensor<2>, device: &Device) -> Tensor<2> {
    let [rows, cols] = weight.dims();
    let param = |tensor| Param::initialized(ParamId::from(0), tensor);
    match op {
        "embedding" => {
            let ids = (0..16).map(|i| (i * 37 % rows) as i64).collect::<Vec<_>>();
            let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [2, 8]), device);
            Embedding {
                weight: param(weight),
            }
            .forward(ids)
            .reshape([16, cols])
        }
        "linear-row" => Linear {
            weight: param(weight),
            bias: None,
        }
        .forward(activation([4, rows], device)),
        "linear-col" => Linear {
            weight: param(weight.transpose()),
            bias: None,
        }
        .forward(activation([4, cols], device)),
        "matmul" => weight.matmul(activation([cols, 4], device)),
        other => unreachable!("no op {other}"),
    }
}

/// `op` on the quantized tensor built from `data` and on its dequantized copy: the largest difference
/// and the largest reference value.
fn compare(op: &str, data: TensorData, device: &Device) -> Result<(f32, f32), String> {
    let dtype = data.dtype();
    let quantized = Tensor::<2>::from_data(data, (device, dtype));
    let reference = tensor_values(run(op, quantized.clone().dequantize(), device))?;
    let computed = tensor_values(run(op, quantized, device))?;
    let max_abs = computed
        .iter()
        .zip(&reference)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, |m, d| if d.is_nan() { f32::NAN } else { m.max(d) });
    let max_ref = reference.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    Ok((max_abs, max_ref))
}

fn tensor_values(tensor: Tensor<2>) -> Result<Vec<f32>, String> {
    crate::tensors::into_f32(tensor.into_data())
}

/// Every op on every 2-D quantized tensor of `input`, one verdict line each; a panic in one does not
/// stop the others.
pub fn compute(device: &Device, input: &Path) -> Result<(), String> {
    for (name, data) in decode::open(input)? {
        if !matches!(data.dtype(), DType::QFloat(_)) || data.shape().len() != 2 {
            continue;
        }
        for op in OPS {
            let verdict = match report::catching(|| compare(op, data.clone(), device)) {
                Ok((max_abs, max_ref)) => serde_json::json!(
                    {"name": name, "op": op, "ok": true, "max_abs": max_abs, "max_ref": max_ref}),
                Err(message) => {
                    serde_json::json!({"name": name, "op": op, "ok": false, "error": message})
                }
            };
            println!("{verdict}");
        }
    }
    Ok(())
}
