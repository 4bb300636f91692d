//! A policy over a device, with the layers every caller of a policy needs and nothing more.
//!
//! [`PolicyDriver`] owns a [`Policy`], the device it draws from, the hard limit, the
//! statistics that the [`Upstream`] layer keeps (segments, reserved bytes, device calls) and
//! the [`EventSink`] its segment events go to. The pool runs its policy through one; the
//! benchmarks measure placement alone through one (no lock, no live table, no block
//! statistics); tests drive a policy block by block through one. One place builds the
//! upstream layers over a policy.

use std::sync::Arc;

use gpumem_device::Device;

use crate::events::EventSink;
use crate::policy::{
    AllocRequest, Block, Exhausted, FreedInFlight, Policy, ReleaseTarget, Upstream,
};
use crate::stats::MemoryStats;

/// A policy, its device and the upstream layers (hard limit, statistics, events).
pub struct PolicyDriver {
    device: Arc<dyn Device>,
    policy: Box<dyn Policy>,
    hard_limit: Option<u64>,
    stats: MemoryStats,
    events: EventSink,
    freed: FreedInFlight,
}

impl PolicyDriver {
    /// Drives `policy` over `device`; reserved memory never exceeds `hard_limit` bytes.
    pub fn new(device: Arc<dyn Device>, policy: Box<dyn Policy>, hard_limit: Option<u64>) -> Self {
        let stats = MemoryStats {
            max_split_size: policy.max_split_size().unwrap_or(u64::MAX),
            ..MemoryStats::default()
        };
        PolicyDriver {
            device,
            policy,
            hard_limit,
            stats,
            events: EventSink::default(),
            freed: FreedInFlight::default(),
        }
    }

    /// Serves a request from the policy's cache or by growing through the upstream layers.
    #[inline]
    pub fn allocate(&mut self, request: AllocRequest) -> Result<Block, Box<Exhausted>> {
        self.with_upstream(|policy, up| policy.allocate(request, up))
    }

    /// Gives a block from [`PolicyDriver::allocate`] back to the policy. Work queued on its
    /// stream before the free may still use it: the policy may reuse it on that stream at once,
    /// but not unmap, release or lend it elsewhere before that work is known complete.
    #[inline]
    pub fn free(&mut self, block: Block) {
        self.freed.freed_on(block.stream);
        self.with_upstream(|policy, up| policy.free(block, up))
    }

    /// The host has seen every stream's work complete (after a device synchronisation): memory
    /// freed so far is no longer in use.
    pub fn device_synchronized(&mut self) {
        self.freed.all_settled();
    }

    /// Gives cached memory back to the device; returns the bytes released.
    pub fn release_cached(&mut self, target: ReleaseTarget) -> u64 {
        self.with_upstream(|policy, up| policy.release_cached(target, up))
    }

    /// Runs `f` on the policy with the upstream layers over the device: for sequences that
    /// must see the same upstream (release and retry, say).
    pub fn with_upstream<R>(
        &mut self,
        f: impl FnOnce(&mut dyn Policy, &mut Upstream<'_>) -> R,
    ) -> R {
        let mut up = Upstream::new(
            self.device.as_ref(),
            self.hard_limit,
            &mut self.stats,
            &mut self.events,
            &mut self.freed,
        );
        f(self.policy.as_mut(), &mut up)
    }

    /// The policy.
    pub fn policy(&self) -> &dyn Policy {
        self.policy.as_ref()
    }

    /// The hard limit in bytes, if any.
    pub fn hard_limit(&self) -> Option<u64> {
        self.hard_limit
    }

    /// Changes the hard limit: later growth is checked against it (memory already reserved
    /// above it stays until released).
    pub fn set_hard_limit(&mut self, hard_limit: Option<u64>) {
        self.hard_limit = hard_limit;
    }

    /// The statistics: segments, reserved bytes and device calls as the upstream layer counts
    /// them, and whatever the caller keeps in them.
    pub fn stats(&self) -> &MemoryStats {
        &self.stats
    }

    /// The statistics, for a caller that keeps block-level ones (the pool).
    pub fn stats_mut(&mut self) -> &mut MemoryStats {
        &mut self.stats
    }

    /// Where events go.
    pub fn events(&self) -> &EventSink {
        &self.events
    }

    /// Where events go, to emit block-level ones or attach observers.
    pub fn events_mut(&mut self) -> &mut EventSink {
        &mut self.events
    }
}
