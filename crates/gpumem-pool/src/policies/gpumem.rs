//! PLACEHOLDER (being written): gpumem policy.

use super::passthrough::PassthroughPolicy;
use crate::policy::{AllocRequest, Block, Exhausted, Policy, ReleaseTarget, SegmentView, Upstream};

/// gpumem policy (placeholder delegating to pass-through until written).
#[derive(Default)]
pub struct GpumemPolicy {
    inner: PassthroughPolicy,
}

impl GpumemPolicy {
    /// A new policy.
    pub fn new() -> Self {
        GpumemPolicy {
            inner: PassthroughPolicy::default(),
        }
    }
}

impl Policy for GpumemPolicy {
    fn name(&self) -> &'static str {
        "gpumem"
    }
    fn allocate(&mut self, req: AllocRequest, up: &mut Upstream<'_>) -> Result<Block, Exhausted> {
        self.inner.allocate(req, up)
    }
    fn free(&mut self, block: Block, up: &mut Upstream<'_>) {
        self.inner.free(block, up)
    }
    fn release_cached(&mut self, t: ReleaseTarget, up: &mut Upstream<'_>) -> u64 {
        self.inner.release_cached(t, up)
    }
    fn segments(&self) -> Vec<SegmentView> {
        self.inner.segments()
    }
    fn largest_free_block(&self) -> u64 {
        self.inner.largest_free_block()
    }
}
