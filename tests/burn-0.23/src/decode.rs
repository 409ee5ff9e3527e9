//! Opens a burnpack with `BurnpackStore` and decodes every tensor on one backend, as Burn 0.23 would.
//!
//! tests/burn's src/decode.rs but for one call: 0.23's store hands out `StoreTensor`s, read with
//! `StoreTensor::to_data`, where 0.22's hands out burn-pack tensors read with `bridge::to_data`.

use std::path::Path;

use burn::prelude::*;
use burn::tensor::DType;
use burn_store::{BurnpackStore, ModuleStore};

use crate::report::{self, with_rank};
use crate::tensors;

/// Every tensor of `input` built on `device` with `Tensor::from_data`, dequantized, as f32.
pub fn dequantize(device: &Device, input: &Path, output: &Path) -> Result<(), String> {
    report::write_f32(
        output,
        &report::decode_all(open(input)?, |data| decode(device, data))?,
    )
}

/// As `dequantize`, but a panic in one tensor does not stop the others: each tensor's verdict
/// is a JSON line on stdout, and the tensors that decoded go to `output`.
pub fn probe(device: &Device, input: &Path, output: &Path) -> Result<(), String> {
    report::write_f32(
        output,
        &report::probe_each(open(input)?, |data| decode(device, data)),
    )
}

/// The file's tensors as Burn's `TensorData`, by name.
pub fn open(input: &Path) -> Result<Vec<(String, TensorData)>, String> {
    let mut store = BurnpackStore::from_file(input);
    let tensors = store
        .get_all_tensors()
        .map_err(|err| format!("{}: {err}", input.display()))?;
    tensors
        .iter()
        .map(|(name, tensor)| {
            tensor
                .to_data()
                .map(|data| (name.clone(), data))
                .map_err(|err| format!("{name}: {err}"))
        })
        .collect()
}

/// One tensor built on the device from its data, dequantized when quantized, read back as f32.
fn decode(device: &Device, data: TensorData) -> Result<(Vec<usize>, Vec<f32>), String> {
    let shape = data.shape().to_vec();
    let dtype = data.dtype();
    // Burn has no rank-0 tensor: a scalar travels as one element and keeps its empty shape.
    let data = if shape.is_empty() {
        TensorData::from_bytes_vec(data.as_bytes().to_vec(), vec![1], dtype)
    } else {
        data
    };
    let values = with_rank!(shape.len().max(1), D => match dtype {
        DType::QFloat(_) => Tensor::<D>::from_data(data, (device, dtype)).dequantize().into_data(),
        DType::F64 | DType::F32 | DType::Flex32 | DType::F16 | DType::BF16 => {
            Tensor::<D>::from_data(data, (device, dtype)).into_data()
        }
        DType::Bool(_) => Tensor::<D, Bool>::from_data(data, device).into_data(),
        _ => Tensor::<D, Int>::from_data(data, (device, dtype)).into_data(),
    });
    Ok((shape, tensors::into_f32(values)?))
}
