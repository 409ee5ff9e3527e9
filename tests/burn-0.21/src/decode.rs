//! Opens a burnpack with `BurnpackStore` and decodes a tensor on one backend, as Burn 0.21 would.

use std::path::Path;

use burn::prelude::*;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, TensorData};
use burn_store::{BurnpackStore, ModuleStore};

use crate::report::with_rank;

/// The file's tensors as Burn's `TensorData`, by name. In 0.21 the store hands out
/// `TensorSnapshot`s (`get_all_snapshots`), each read with `TensorSnapshot::to_data`.
pub fn open(input: &Path) -> Result<Vec<(String, TensorData)>, String> {
    let mut store = BurnpackStore::from_file(input);
    let snapshots = store
        .get_all_snapshots()
        .map_err(|err| format!("{}: {err}", input.display()))?;
    snapshots
        .iter()
        .map(|(name, snapshot)| {
            snapshot
                .to_data()
                .map(|data| (name.clone(), data))
                .map_err(|err| format!("{name}: {err}"))
        })
        .collect()
}

/// One tensor built on the device from its data, dequantized when quantized, read back as f32.
pub fn decode<B: Backend>(
    device: &B::Device,
    data: TensorData,
) -> Result<(Vec<usize>, Vec<f32>), String> {
    let shape = data.shape.to_vec();
    let dtype = data.dtype;
    // Burn has no rank-0 tensor: a scalar travels as one element and keeps its empty shape.
    let data = if shape.is_empty() {
        TensorData::from_bytes_vec(data.as_bytes().to_vec(), vec![1], dtype)
    } else {
        data
    };
    let values = with_rank!(shape.len().max(1), D => match dtype {
        DType::QFloat(_) => Tensor::<B, D>::from_data(data, (device, dtype)).dequantize().into_data(),
        DType::F64 | DType::F32 | DType::Flex32 | DType::F16 | DType::BF16 => {
            Tensor::<B, D>::from_data(data, (device, dtype)).into_data()
        }
        DType::Bool(_) => Tensor::<B, D, Bool>::from_data(data, device).into_data(),
        _ => Tensor::<B, D, Int>::from_data(data, (device, dtype)).into_data(),
    });
    Ok((shape, into_f32(values)?))
}

/// The values of `data` as f32, read back from the device. 0.21 has no `try_into_vec_as`: convert the
/// element type first, then take the vector.
pub fn into_f32(data: TensorData) -> Result<Vec<f32>, String> {
    data.convert::<f32>()
        .into_vec::<f32>()
        .map_err(|err| format!("{err:?}"))
}
