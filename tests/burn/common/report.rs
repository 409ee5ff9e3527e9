//! What both harnesses write: f32 safetensors of what Burn decoded, one JSON verdict per tensor for
//! `probe`, and a macro for tensors whose rank is known only at run time.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use safetensors::{Dtype, tensor::TensorView};

/// A tensor's name, its logical shape and what Burn decoded it to.
pub type Decoded = (String, Vec<usize>, Vec<f32>);

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

/// Every tensor decoded with `decode`, the first error ending it.
pub fn decode_all<T>(
    tensors: Vec<(String, T)>,
    decode: impl Fn(T) -> Result<(Vec<usize>, Vec<f32>), String>,
) -> Result<Vec<Decoded>, String> {
    tensors
        .into_iter()
        .map(|(name, data)| decode(data).map(|(shape, values)| (name, shape, values)))
        .collect()
}

/// Every tensor decoded with `decode`, a panic or error in one not stopping the others: each tensor's
/// verdict is a JSON line on stdout; the tensors that decoded are returned.
pub fn probe_each<T>(
    tensors: Vec<(String, T)>,
    decode: impl Fn(T) -> Result<(Vec<usize>, Vec<f32>), String>,
) -> Vec<Decoded> {
    let mut decoded = Vec::new();
    for (name, data) in tensors {
        let verdict = match catching(|| decode(data)) {
            Ok((shape, values)) => {
                decoded.push((name.clone(), shape, values));
                serde_json::json!({"name": name, "ok": true})
            }
            Err(message) => serde_json::json!({"name": name, "ok": false, "error": message}),
        };
        println!("{verdict}");
    }
    decoded
}

/// `run`'s result, a panic in it turned into an error with the panic's message (and not printed).
pub fn catching<T>(run: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = catch_unwind(AssertUnwindSafe(run));
    std::panic::set_hook(hook);
    result.unwrap_or_else(|payload| Err(panic_message(payload.as_ref())))
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|message| message.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".to_string())
}

/// Writes f32 tensors under their names. A tensor of rank 0 keeps its empty shape.
pub fn write_f32(path: &Path, tensors: &[Decoded]) -> Result<(), String> {
    let views = tensors
        .iter()
        .map(|(name, shape, values)| {
            // SAFETY: f32 has no padding and every byte pattern is a valid u8.
            let bytes = unsafe {
                std::slice::from_raw_parts(
                    values.as_ptr().cast::<u8>(),
                    std::mem::size_of_val(&values[..]),
                )
            };
            TensorView::new(Dtype::F32, shape.clone(), bytes).map(|view| (name.clone(), view))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| err.to_string())?;
    safetensors::serialize_to_file(views, None, path)
        .map_err(|err| format!("{}: {err}", path.display()))
}
