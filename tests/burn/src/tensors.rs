//! Burn 0.22's `TensorData` from f32 safetensors, and back to f32 values.

use std::path::Path;

use burn::prelude::*;
use burn::tensor::DType;
use safetensors::{Dtype, SafeTensors};

/// Every f32 tensor of a safetensors file, by name, in the file's order.
pub fn read_f32(path: &Path) -> Result<Vec<(String, TensorData)>, String> {
    let buffer = std::fs::read(path).map_err(|err| format!("{}: {err}", path.display()))?;
    let file =
        SafeTensors::deserialize(&buffer).map_err(|err| format!("{}: {err}", path.display()))?;
    file.iter()
        .map(|(name, view)| {
            if view.dtype() != Dtype::F32 {
                return Err(format!(
                    "{name}: the harness reads f32 tensors, not {:?}",
                    view.dtype()
                ));
            }
            let data =
                TensorData::from_bytes_vec(view.data().to_vec(), view.shape().to_vec(), DType::F32);
            Ok((name.to_string(), data))
        })
        .collect()
}

/// The values of `data` as f32, read back from the device.
pub fn into_f32(data: TensorData) -> Result<Vec<f32>, String> {
    data.try_into_vec_as::<f32>()
        .map_err(|err| format!("{err:?}"))
}
