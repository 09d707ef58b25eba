//! Errors of the DLPack export.

use longshore_data::DType;

/// What can fail while exporting a batch as DLPack tensors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DlpackError {
    /// DLPack has no code for this element type.
    #[error("tensor {tensor} has dtype {dtype}, which DLPack cannot describe")]
    UnsupportedDType {
        /// Index of the tensor in its batch.
        tensor: usize,
        /// Its dtype.
        dtype: DType,
    },
    /// A dimension or the number of dimensions does not fit DLPack's `int64_t` / `int32_t`.
    #[error("tensor {tensor} has a shape DLPack cannot hold: {shape:?}")]
    Shape {
        /// Index of the tensor in its batch.
        tensor: usize,
        /// The shape.
        shape: Vec<usize>,
    },
    /// The batch's layout reaches past its storage.
    #[error("tensor {tensor} needs bytes {start}..{end}, but the storage holds {len}")]
    OutOfBounds {
        /// Index of the tensor in its batch.
        tensor: usize,
        /// First byte.
        start: usize,
        /// One past the last byte.
        end: usize,
        /// Bytes in the storage.
        len: usize,
    },
    /// The consumer asked for something this export cannot give without a copy.
    #[error("cannot export {what}: {reason}")]
    Unsupported {
        /// What was asked.
        what: &'static str,
        /// Why it cannot be done.
        reason: String,
    },
    /// Ordering the consumer's stream after the batch failed.
    #[error(transparent)]
    Transfer(#[from] longshore_transfer::TransferError),
}
