//! `compute` in Burn 0.21: `Embedding` and `Linear` (Row and Col layout) forward, and a matmul against a
//! float activation, each on the QFloat tensor itself and on its `dequantize()`, as tests/burn's
//! src/compute.rs runs them in 0.22. The ops, their inputs and the verdict lines are shared
//! (tests/burn/common/ops.rs); what differs is 0.21's API: a tensor names its backend (`Tensor<B, D>`,
//! so the functions here are generic over `B`) where 0.22's `Tensor<D>` holds a backend-erased `Device`,
//! and `TensorData`'s shape and dtype are fields, not methods.

use std::path::Path;

use burn::module::{Param, ParamId};
use burn::nn::{Embedding, Linear};
use burn::prelude::*;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, TensorData};

use crate::decode;
use crate::ops;

/// A float activation of `shape` with values spread over [-1, 1), the same on every backend.
fn activation<B: Backend, const D: usize>(shape: [usize; D], device: &B::Device) -> Tensor<B, D> {
    let count = shape.iter().product::<usize>();
    let values = ops::activation_values(count);
    Tensor::<B, 1>::from_data(TensorData::new(values, [count]), device).reshape(shape)
}

/// `op` run on `weight` (quantized or float), as Burn's modules run it; Col loads a `[d_output, d_input]`
/// weight transposed, as `LinearLayout::Col`'s load mapper does.
fn run<B: Backend>(op: &str, weight: Tensor<B, 2>, device: &B::Device) -> Tensor<B, 2> {
    let [rows, cols] = weight.dims();
    let param = |tensor| Param::initialized(ParamId::from(0), tensor);
    match op {
        "embedding" => {
            let ids = ops::token_ids(rows);
            let count = ids.len();
            let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, ops::IDS_SHAPE), device);
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
fn compare<B: Backend>(
    op: &str,
    data: TensorData,
    device: &B::Device,
) -> Result<(f32, f32), String> {
    let dtype = data.dtype;
    let quantized = Tensor::<B, 2>::from_data(data, (device, dtype));
    let reference = decode::into_f32(run(op, quantized.clone().dequantize(), device).into_data())?;
    let computed = decode::into_f32(run(op, quantized, device).into_data())?;
    Ok(ops::differences(&computed, &reference))
}

/// Every op on every 2-D quantized tensor of `input`, one verdict line each; a panic in one does not
/// stop the others.
pub fn compute<B: Backend>(device: &B::Device, input: &Path) -> Result<(), String> {
    let tensors = decode::open(input)?
        .into_iter()
        .filter(|(_, data)| matches!(data.dtype, DType::QFloat(_)) && data.shape.len() == 2)
        .collect();
    ops::verdicts(tensors, |op, data| compare::<B>(op, data, device));
    Ok(())
}
