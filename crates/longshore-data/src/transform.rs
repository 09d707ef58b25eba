//! The [`Transform`] trait (a possibly random function of a dataset's items) and its
//! combinators; the image transforms are in [`crate::image`].
//!
//! Random transforms draw from the generator they are given; applied through
//! [`crate::DatasetExt::transform`] that is the current worker's generator, seeded
//! per worker ([`crate::worker`]), so a run is reproducible for a given seed and
//! number of workers.
//!
//! A deterministic transform that is one [`FieldTransform`](crate::FieldTransform) per field
//! says so with [`Transform::fuse`]: a dataset transformed by it then keeps its
//! [`DirectPlan`], and batches are written straight from the stored fields through it.

use std::fmt;

use crate::DataError;
use crate::field::DirectPlan;
use crate::rng::Rng;

/// A (possibly random) function applied to each item of a dataset.
pub trait Transform<T>: Send + Sync {
    /// The transformed item.
    type Output: Send;

    /// Transforms `input`, drawing any randomness from `rng`.
    ///
    /// # Errors
    /// When `input` is not something this transform accepts (wrong dtype, too small).
    fn apply(&self, input: T, rng: &mut Rng) -> Result<Self::Output, DataError>;

    /// This transform as per-field transforms of a dataset whose items are planned by `plan`
    /// (its [`DirectPlan`], before this transform): the plan of the transformed dataset,
    /// whose batches must equal, byte for byte, the stacked outputs of
    /// [`apply`](Transform::apply). `None` (the default) when it cannot be: random transforms
    /// (a [`FieldTransform`](crate::FieldTransform) draws nothing), closures, transforms of
    /// a whole item.
    fn fuse<'a>(&'a self, plan: DirectPlan<'a>) -> Option<DirectPlan<'a>> {
        let _ = plan;
        None
    }
}

/// Composition of transforms.
pub trait TransformExt<T>: Transform<T> + Sized {
    /// Applies `self`, then `next`.
    fn then<N: Transform<Self::Output>>(self, next: N) -> Then<Self, N> {
        Then(self, next)
    }
}

impl<T, X: Transform<T>> TransformExt<T> for X {}

/// `A` then `B`; see [`TransformExt::then`].
#[derive(Debug, Clone)]
pub struct Then<A, B>(A, B);

impl<T, A: Transform<T>, B: Transform<A::Output>> Transform<T> for Then<A, B> {
    type Output = B::Output;
    fn apply(&self, input: T, rng: &mut Rng) -> Result<B::Output, DataError> {
        let mid = self.0.apply(input, rng)?;
        self.1.apply(mid, rng)
    }
    fn fuse<'a>(&'a self, plan: DirectPlan<'a>) -> Option<DirectPlan<'a>> {
        self.1.fuse(self.0.fuse(plan)?)
    }
}

/// Applies a transform to the first element of a pair, leaving the second (a label) as is.
#[derive(Debug, Clone)]
pub struct First<X>(pub X);

impl<A, B: Send, X: Transform<A>> Transform<(A, B)> for First<X> {
    type Output = (X::Output, B);
    fn apply(&self, (a, b): (A, B), rng: &mut Rng) -> Result<Self::Output, DataError> {
        Ok((self.0.apply(a, rng)?, b))
    }
}

/// A deterministic transform from a closure.
#[derive(Clone)]
pub struct FnTransform<F>(pub F);

impl<F> fmt::Debug for FnTransform<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnTransform").finish_non_exhaustive()
    }
}

impl<T, U: Send, F: Fn(T) -> Result<U, DataError> + Send + Sync> Transform<T> for FnTransform<F> {
    type Output = U;
    fn apply(&self, input: T, _: &mut Rng) -> Result<U, DataError> {
        (self.0)(input)
    }
}
