//! PLACEHOLDER (being written): PyTorch's native caching allocator policy.

use super::passthrough::PassthroughPolicy;
use super::torch_settings::TorchSettings;
use crate::policy::{AllocRequest, Block, Exhausted, Policy, ReleaseTarget, SegmentView, Upstream};

/// PyTorch's policy (placeholder delegating to pass-through until written).
pub struct TorchPolicy {
    inner: PassthroughPolicy,
    _settings: TorchSettings,
}

impl TorchPolicy {
    /// A policy with PyTorch's `settings`.
    pub fn new(settings: TorchSettings) -> Self {
        TorchPolicy {
            inner: PassthroughPolicy::default(),
            _settings: settings,
        }
    }
}

impl Policy for TorchPolicy {
    fn name(&self) -> &'static str {
        "torch"
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
