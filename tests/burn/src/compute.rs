//! What a Burn model runs on a quantized weight: `Embedding` and `Linear` (Row and Col layout) forward,
//! and a matmul against a float activation, each on the QFloat tensor itself and on its `dequantize()`.
//! The ops, their inputs and the verdict lines are common/ops.rs's, shared with the Burn 0.21 harness.

use std::path::Path;

use burn::module::{Param, ParamId};
use burn::nn::{Embedding, Linear};
use burn::prelude::*;
use burn::tensor::DType;

use crate::decode;
use crate::ops;

/// A float activation of `shape` with values spread over [-1, 1), the same on every backend.
fn activation<const D: usize>(shape: [usize; D], device: &Device) -> Tensor<D> {
    let count = shape.iter().product::<usize>();
    let values = ops::activation_values(count);
    Tensor::<1>::from_data(TensorData::new(values, [count]), device).reshape(shape)
}

/// `op` run on `weight` (quantized or float), as Burn's modules run it; Col loads a `[d_output, d_input]`
/// weight transposed, as `LinearLayout::Col`'s load mapper does.
fn run(op: &str, weight: Tensor<2>, device: &Device) -> Tensor<2> {
    let [rows, cols] = weight.dims();
    let param = |tensor| Param::initialized(ParamId::from(0), tensor);
    match op {
        "embedding" => {
            let ids = ops::token_ids(rows);
            let count = ids.len();
            let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, ops::IDS_SHAPE), device);
            Embedding {
                weight: param(weight),
            }
            .forward(ids)
            .reshape([count, cols])
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
    Ok(ops::differences(&computed, &reference))
}

fn tensor_values(tensor: Tensor<2>) -> Result<Vec<f32>, String> {
    crate::tensors::into_f32(tensor.into_data())
}

/// Every op on every 2-D quantized tensor of `input`, one verdict line each; a panic in one does not
/// stop the others.
pub fn compute(device: &Device, input: &Path) -> Result<(), String> {
    let tensors = decode::open(input)?
        .into_iter()
        .filter(|(_, data)| matches!(data.dtype(), DType::QFloat(_)) && data.shape().len() == 2)
        .collect();
    ops::verdicts(tensors, |op, data| compare(op, data, device));
    Ok(())
}
