//! Safetensors in and out, and Burn tensors of a rank known only at run time.

use std::path::Path;

use burn::prelude::*;
use burn::tensor::DType;
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

/// Runs `$body` with `$rank` bound as the const generic `$D` (ranks 1 to 6).
macro_rules! with_rank {
    ($rank:expr, $D:ident => $body:expr) => {
        match $rank {
            1 => {
                const $D: usize = 1;
                $body
            }
            2 => {
                const $D: usize = 2;
                $body
            }
            3 => {
                const $D: usize = 3;
                $body
            }
            4 => {
                const $D: usize = 4;
                $body
            }
            5 => {
                const $D: usize = 5;
                $body
            }
            6 => {
                const $D: usize = 6;
                $body
            }
            rank => panic!("the harness handles ranks 1 to 6, not {rank}"),
        }
    };
}
pub(crate) use with_rank;

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

/// Writes f32 tensors under their names. A tensor of rank 0 keeps its empty shape.
pub fn write_f32(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) -> Result<(), String> {
    let views = tensors
        .iter()
        .map(|(name, shape, values)| {
            let bytes: &[u8] = bytemuck_f32(values);
            TensorView::new(Dtype::F32, shape.clone(), bytes).map(|view| (name.clone(), view))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| err.to_string())?;
    safetensors::serialize_to_file(views, None, path)
        .map_err(|err| format!("{}: {err}", path.display()))
}

fn bytemuck_f32(values: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and every byte pattern is a valid u8.
    unsafe {
        std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
    }
}

/// The values of `data` as f32, read back from the device.
pub fn into_f32(data: TensorData) -> Result<Vec<f32>, String> {
    data.try_into_vec_as::<f32>()
        .map_err(|err| format!("{err:?}"))
}
