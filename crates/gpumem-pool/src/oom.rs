//! Out-of-memory errors that explain themselves: what was asked, what the device and the pool
//! held, and what to try, most promising first.

use std::fmt;

use gpumem_device::StreamId;

use crate::policy::{AllocRequest, Exhausted, UpstreamError};
use crate::size::Bytes;

/// One suggestion in an OOM error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advice {
    /// What to do, e.g. `try GPUMEM_POOL=expandable`.
    pub action: String,
    /// Why, with the numbers behind it.
    pub reason: String,
    /// Bytes it could make available; advice is ranked by this.
    pub bytes: u64,
}

/// What the pool and the device held when an allocation failed: the numbers an
/// [`OomError`] explains.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolFacts {
    /// The name of the policy in force.
    pub policy: &'static str,
    /// Device name.
    pub device: String,
    /// Device total memory.
    pub device_total: u64,
    /// Device free memory when the allocation failed.
    pub device_free: u64,
    /// Bytes allocated from the pool.
    pub allocated: u64,
    /// Bytes reserved by the pool from the device.
    pub reserved: u64,
    /// The largest cached block.
    pub largest_free_block: u64,
    /// The hard limit in force, if any.
    pub hard_limit: Option<u64>,
}

/// An allocation that failed after the pool freed its cache and retried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OomError {
    /// Bytes the user asked for.
    pub requested: u64,
    /// Bytes the policy last tried to obtain from the device (a whole segment, say).
    pub attempted: u64,
    /// Stream of the request.
    pub stream: StreamId,
    /// What the pool and the device held.
    pub pool: PoolFacts,
    /// The last refusal from the device or the limit.
    pub cause: UpstreamError,
    /// What to try, most promising first.
    pub advice: Vec<Advice>,
}

impl OomError {
    /// Reserved bytes that hold no allocation: cache and fragmentation.
    pub fn reserved_unallocated(&self) -> u64 {
        self.pool.reserved.saturating_sub(self.pool.allocated)
    }

    /// Device memory in use outside this pool (other pools, processes, the CUDA context).
    pub fn used_elsewhere(&self) -> u64 {
        self.pool
            .device_total
            .saturating_sub(self.pool.device_free)
            .saturating_sub(self.pool.reserved)
    }

    /// The explained failure of `request`: what the policy last tried (`failure`), what the
    /// pool and device held (`facts`), and what to try, ranked by the bytes each could make
    /// available. `fragmentation_advice` is the policy's own suggestion for memory that is
    /// reserved but unusable ([`crate::Policy::fragmentation_advice`]). The one place an OOM
    /// error is put together.
    pub fn explain(
        request: AllocRequest,
        failure: Exhausted,
        facts: PoolFacts,
        fragmentation_advice: &str,
    ) -> OomError {
        let error = OomError {
            requested: request.size,
            attempted: failure.attempted,
            stream: request.stream,
            pool: facts,
            cause: failure.cause,
            advice: Vec::new(),
        };
        error.with_advice(fragmentation_advice)
    }

    /// Fills in [`OomError::advice`] from the numbers, ranked by bytes each could free.
    fn with_advice(mut self, fragmentation_advice: &str) -> Self {
        let mut advice = Vec::new();
        let shortfall = self.requested.saturating_sub(self.pool.largest_free_block);
        let idle = self.reserved_unallocated();
        if idle > 0 {
            advice.push(Advice {
                action: fragmentation_advice.to_string(),
                reason: format!(
                    "{} reserved but unallocated, largest free block {} — fragmentation",
                    Bytes(idle),
                    Bytes(self.pool.largest_free_block)
                ),
                bytes: idle,
            });
        }
        if let Some(limit) = self.pool.hard_limit {
            let beyond = self
                .pool
                .device_free
                .min(self.pool.device_total.saturating_sub(limit));
            if beyond > 0 {
                advice.push(Advice {
                    action: "raise GPUMEM_HARD_LIMIT".into(),
                    reason: format!(
                        "the limit is {}, and the device has {} free beyond it",
                        Bytes(limit),
                        Bytes(beyond)
                    ),
                    bytes: beyond,
                });
            }
        }
        let elsewhere = self.used_elsewhere();
        if elsewhere > 0 {
            advice.push(Advice {
                action: "free device memory held outside this pool, or run alone on the GPU".into(),
                reason: format!(
                    "{} of the device is used by other pools, processes or the CUDA context",
                    Bytes(elsewhere)
                ),
                bytes: elsewhere,
            });
        }
        advice.push(Advice {
            action: "reduce live memory: a smaller batch, gradient checkpointing, bf16 or an 8-bit optimizer; `gpumem plan` finds a batch that fits".into(),
            reason: format!(
                "{} is allocated and {} more is needed",
                Bytes(self.pool.allocated),
                Bytes(shortfall.max(1))
            ),
            bytes: self.pool.allocated,
        });
        advice.sort_by_key(|a| std::cmp::Reverse(a.bytes));
        self.advice = advice;
        self
    }
}

impl fmt::Display for OomError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "out of memory: tried to allocate {} on stream {} (policy {}",
            Bytes(self.requested),
            self.stream.0,
            self.pool.policy
        )?;
        if self.attempted > self.requested {
            write!(
                f,
                ", which needed a new segment of {}",
                Bytes(self.attempted)
            )?;
        }
        writeln!(f, ").")?;
        writeln!(
            f,
            "Device {} has {} in total, of which {} is free.",
            self.pool.device,
            Bytes(self.pool.device_total),
            Bytes(self.pool.device_free)
        )?;
        writeln!(
            f,
            "This pool holds {} allocated and {} reserved but unallocated; the largest free block is {}.",
            Bytes(self.pool.allocated),
            Bytes(self.reserved_unallocated()),
            Bytes(self.pool.largest_free_block)
        )?;
        match self.pool.hard_limit {
            Some(limit) => writeln!(f, "Memory limit: hard = {}.", Bytes(limit))?,
            None => writeln!(f, "Memory limit: none.")?,
        }
        writeln!(f, "Last refusal: {}.", self.cause)?;
        write!(f, "What to try, most promising first:")?;
        for (i, a) in self.advice.iter().enumerate() {
            write!(f, "\n  {}. {} ({})", i + 1, a.action, a.reason)?;
        }
        Ok(())
    }
}

impl std::error::Error for OomError {}
