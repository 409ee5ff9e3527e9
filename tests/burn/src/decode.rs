//! Opens a burnpack with `BurnpackStore` and decodes every tensor on one backend, as Burn would.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use burn::prelude::*;
use burn::tensor::DType;
use burn_store::{BurnpackStore, ModuleStore, bridge};

use crate::tensors::{self, with_rank};

/// A tensor's name, its logical shape and what Burn decoded it to.
type Decoded = (String, Vec<usize>, Vec<f32>);

/// Every tensor of `input` built on `device` with `Tensor::from_data`, dequantized, as f32.
pub fn dequantize(device: &Device, input: &Path, output: &Path) -> Result<(), String> {
    let decoded = open(input)?
        .into_iter()
        .map(|(name, data)| decode(device, data).map(|(shape, values)| (name, shape, values)))
        .collect::<Result<Vec<Decoded>, String>>()?;
    tensors::write_f32(output, &decoded)
}

/// As `dequantize`, but a panic in one tensor does not stop the others: each tensor's verdict
/// is a JSON line on stdout, and the tensors that decoded go to `output`.
pub fn probe(device: &Device, input: &Path, output: &Path) -> Result<(), String> {
    let quiet_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut decoded = Vec::new();
    for (name, data) in open(input)? {
        let verdict = match catch_unwind(AssertUnwindSafe(|| decode(device, data))) {
            Ok(Ok((shape, values))) => {
                decoded.push((name.clone(), shape, values));
                Ok(())
            }
            Ok(Err(message)) => Err(message),
            Err(payload) => Err(panic_message(payload.as_ref())),
        };
        let line = match verdict {
            Ok(()) => serde_json::json!({"name": name, "ok": true}),
            Err(message) => serde_json::json!({"name": name, "ok": false, "error": message}),
        };
        println!("{line}");
    }
    std::panic::set_hook(quiet_hook);
    tensors::write_f32(output, &decoded)
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|message| message.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".to_string())
}

/// The file's tensors as Burn's `TensorData`, by name.
fn open(input: &Path) -> Result<Vec<(String, TensorData)>, String> {
    let mut store = BurnpackStore::from_file(input);
    let tensors = store
        .get_all_tensors()
        .map_err(|err| format!("{}: {err}", input.display()))?;
    tensors
        .iter()
        .map(|(name, tensor)| {
            bridge::to_data(tensor)
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
    let rank = shape.len().max(1);
    let data = if shape.is_empty() {
        reshape(data, vec![1])
    } else {
        data
    };
    let values = with_rank!(rank, D => match dtype {
        DType::QFloat(_) => Tensor::<D>::from_data(data, (device, dtype)).dequantize().into_data(),
        DType::F64 | DType::F32 | DType::Flex32 | DType::F16 | DType::BF16 => {
            Tensor::<D>::from_data(data, (device, dtype)).into_data()
        }
        DType::Bool(_) => Tensor::<D, Bool>::from_data(data, device).into_data(),
        _ => Tensor::<D, Int>::from_data(data, (device, dtype)).into_data(),
    });
    Ok((shape, tensors::into_f32(values)?))
}

fn reshape(data: TensorData, shape: Vec<usize>) -> TensorData {
    let dtype = data.dtype();
    TensorData::from_bytes_vec(data.as_bytes().to_vec(), shape, dtype)
}
