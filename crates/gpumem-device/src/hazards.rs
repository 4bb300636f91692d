//! [`HazardChecker`]: a device adaptor that finds memory handed back, moved or lent to another
//! stream while work queued before may still use it.
//!
//! A GPU runs behind the host. A kernel launched on a stream touches its memory some time
//! later, so a pool that unmaps, releases or re-lends memory as soon as the host says "free"
//! can pull it from under work still queued. `cudaFree` is safe (it synchronises the device),
//! but the virtual-memory calls (`cuMemUnmap`, `cuMemRelease`) do not synchronise, and a block
//! reused on another stream is safe only once that stream is ordered after the last use (an
//! event it waited for, or a host synchronisation). Such bugs pass every test on a device that
//! completes work at once; on a real GPU they are illegal memory accesses or silent corruption.
//!
//! The checker wraps any [`Device`] and keeps a happens-before model of the work issued through
//! it: a vector clock per stream (what the stream's next work is ordered after), one per event,
//! and one for the host (the work the host has *seen* complete: synchronisations, event waits,
//! event queries that said "completed", and `free`, which synchronises). Work is declared with
//! [`HazardChecker::launch`] (a kernel on a stream touching address ranges) and copies through
//! the checker count as work too. Each use is remembered by virtual address (for unmaps) and by
//! physical memory (malloc regions and VMM chunks, so that a chunk mapped at two addresses is
//! one piece of memory). A [`Hazard`] is recorded, and the call goes on, when
//! - an unmap covers memory whose last use the host has not seen complete
//!   ([`HazardKind::UnmappedInFlight`]);
//! - work on one stream touches memory whose last use on another stream is not ordered before
//!   it ([`HazardKind::ReusedAcrossStreams`]);
//! - work touches an address that is neither allocated nor mapped
//!   ([`HazardKind::IllegalAddress`]).
//!
//! The model is strict on purpose: a use counts as in flight until the host or the stream has
//! been *ordered* after it, however long ago it was issued, as a data race is a race whatever
//! the timing that hid it.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{
    Device, DeviceError, DevicePtr, EventId, InFlight, ManagedAdvice, MemInfo, MemoryLocation,
    PhysicalHandle, PinnedBuffer, StreamId, VirtualMemory,
};

/// What went wrong, in the checker's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HazardKind {
    /// Memory was unmapped while work that used it may still have been running.
    UnmappedInFlight,
    /// Memory was used on a stream while its last use on another stream may still have been
    /// running (no event or synchronisation ordered the two).
    ReusedAcrossStreams,
    /// Work touched an address that no allocation or mapping backs.
    IllegalAddress,
}

/// One hazard: what happened, where, and the work it collided with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hazard {
    /// The kind.
    pub kind: HazardKind,
    /// The device call that caused it (`"unmap"`, `"launch"`, `"copy_to_device"`, …).
    pub call: &'static str,
    /// The address range of the call that collided (start, bytes).
    pub range: (DevicePtr, u64),
    /// The stream of the new work (for `launch` and copies); `None` for host calls.
    pub stream: Option<StreamId>,
    /// The earlier use still in flight (its stream and the label its launch gave), if any.
    pub in_flight: Option<(StreamId, u64)>,
    /// What the caller said it was doing when the call was made ([`HazardChecker::set_context`]).
    pub context: String,
}

impl fmt::Display for Hazard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            HazardKind::UnmappedInFlight => "unmapped while in use",
            HazardKind::ReusedAcrossStreams => "reused across streams without ordering",
            HazardKind::IllegalAddress => "illegal address",
        };
        write!(
            f,
            "{what}: {} of [{:#x}, +{} B)",
            self.call, self.range.0, self.range.1
        )?;
        if let Some(stream) = self.stream {
            write!(f, " on stream {}", stream.0)?;
        }
        if let Some((stream, label)) = self.in_flight {
            write!(
                f,
                "; work labelled {label} on stream {} may still use it",
                stream.0
            )?;
        }
        if !self.context.is_empty() {
            write!(f, " (during {})", self.context)?;
        }
        Ok(())
    }
}

/// Runs a declared kernel's time on the wrapped device (see [`HazardChecker::with_work`]).
pub type WorkHook = Box<dyn Fn(StreamId, u64) -> Result<(), DeviceError> + Send + Sync>;

/// A device adaptor that reports memory reused while work may still use it (see the
/// [module](self) documentation). Every [`Device`] and [`VirtualMemory`] call is passed on to
/// the wrapped device unchanged; the checker only watches.
pub struct HazardChecker {
    inner: Arc<dyn Device>,
    work: Option<WorkHook>,
    state: Mutex<State>,
}

/// A vector clock: per stream, the number of that stream's uses ordered before. Sorted by
/// stream, so that a lookup is a binary search and a join one merge (a replay of a trace
/// with hundreds of streams joins clocks at every use and synchronisation).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Clock(Vec<(StreamId, u64)>);

impl Clock {
    fn get(&self, stream: StreamId) -> u64 {
        self.0
            .binary_search_by_key(&stream, |&(s, _)| s)
            .map_or(0, |i| self.0[i].1)
    }

    fn raise(&mut self, stream: StreamId, n: u64) {
        match self.0.binary_search_by_key(&stream, |&(s, _)| s) {
            Ok(i) => self.0[i].1 = self.0[i].1.max(n),
            Err(i) => self.0.insert(i, (stream, n)),
        }
    }

    fn join(&mut self, other: &Clock) {
        if other.0.iter().all(|&(stream, n)| self.covers(stream, n)) {
            return;
        }
        let mut merged = Vec::with_capacity(self.0.len().max(other.0.len()));
        let (mut mine, mut theirs) = (self.0.iter().peekable(), other.0.iter().peekable());
        loop {
            let next = match (mine.peek(), theirs.peek()) {
                (Some(&&(a, m)), Some(&&(b, t))) if a == b => {
                    mine.next();
                    theirs.next();
                    (a, m.max(t))
                }
                (Some(&&(a, m)), Some(&&(b, _))) if a < b => {
                    mine.next();
                    (a, m)
                }
                (_, Some(&&(b, t))) => {
                    theirs.next();
                    (b, t)
                }
                (Some(&&(a, m)), None) => {
                    mine.next();
                    (a, m)
                }
                (None, None) => break,
            };
            merged.push(next);
        }
        self.0 = merged;
    }

    /// Whether the use `n` of `stream` is ordered before.
    fn covers(&self, stream: StreamId, n: u64) -> bool {
        self.get(stream) >= n
    }
}

/// One use of memory: the stream, its sequence number there, and the launch's label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Use {
    stream: StreamId,
    seq: u64,
    label: u64,
}

/// Non-overlapping address ranges, each with the latest use per stream that is not known to
/// be ordered before the others.
#[derive(Debug, Default)]
struct RangeUses {
    /// Start → (end, uses).
    pieces: BTreeMap<u64, (u64, Vec<Use>)>,
}

impl RangeUses {
    /// Splits the piece that strictly contains `at`, if any.
    fn split_at(&mut self, at: u64) {
        let Some((&start, (end, uses))) = self.pieces.range(..at).next_back() else {
            return;
        };
        if *end > at {
            let (end, uses) = (*end, uses.clone());
            self.pieces.get_mut(&start).expect("found above").0 = at;
            self.pieces.insert(at, (end, uses));
        }
    }

    /// The uses of every piece overlapping `[lo, hi)`.
    fn uses_in(&self, lo: u64, hi: u64) -> impl Iterator<Item = &Use> + '_ {
        let first = self
            .pieces
            .range(..=lo)
            .next_back()
            .filter(|(_, (end, _))| *end > lo)
            .map_or(lo, |(&start, _)| start);
        self.pieces
            .range(first..hi)
            .flat_map(|(_, (_, uses))| uses.iter())
    }

    /// Merges the pieces of `[lo, hi)` that touch and hold the same uses: a range used whole
    /// again (a cached block reused) becomes one piece again, so the pieces do not pile up with
    /// every boundary ever used inside it.
    fn coalesce(&mut self, lo: u64, hi: u64) {
        let starts: Vec<u64> = self.pieces.range(lo..hi).map(|(&s, _)| s).collect();
        let mut run: Option<u64> = None;
        for start in starts {
            let joins = run.is_some_and(|run| {
                let (end, uses) = &self.pieces[&run];
                *end == start && *uses == self.pieces[&start].1
            });
            match (joins, run) {
                (true, Some(run)) => {
                    let (end, _) = self.pieces.remove(&start).expect("listed above");
                    self.pieces.get_mut(&run).expect("kept above").0 = end;
                }
                _ => run = Some(start),
            }
        }
    }

    /// Applies `f` to the uses of every part of `[lo, hi)` (parts not yet known start empty);
    /// parts left without uses are dropped, and where it wrote more than one part, those left
    /// alike are merged ([`coalesce`]; one part, the common case of a block used whole again,
    /// costs nothing more).
    ///
    /// [`coalesce`]: RangeUses::coalesce
    fn update(&mut self, lo: u64, hi: u64, mut f: impl FnMut(&mut Vec<Use>)) {
        if lo >= hi {
            return;
        }
        self.split_at(lo);
        self.split_at(hi);
        let mut at = lo;
        let mut written = 0;
        let starts: Vec<u64> = self.pieces.range(lo..hi).map(|(&s, _)| s).collect();
        for start in starts {
            if start > at {
                let mut uses = Vec::new();
                f(&mut uses);
                if !uses.is_empty() {
                    self.pieces.insert(at, (start, uses));
                    written += 1;
                }
            }
            let piece = self.pieces.get_mut(&start).expect("listed above");
            f(&mut piece.1);
            at = piece.0;
            if piece.1.is_empty() {
                self.pieces.remove(&start);
            } else {
                written += 1;
            }
        }
        if at < hi {
            let mut uses = Vec::new();
            f(&mut uses);
            if !uses.is_empty() {
                self.pieces.insert(at, (hi, uses));
                written += 1;
            }
        }
        if written > 1 {
            self.coalesce(lo, hi);
        }
    }

    /// Forgets `[lo, hi)`.
    fn remove(&mut self, lo: u64, hi: u64) {
        self.split_at(lo);
        self.split_at(hi);
        let starts: Vec<u64> = self.pieces.range(lo..hi).map(|(&s, _)| s).collect();
        for start in starts {
            self.pieces.remove(&start);
        }
    }

    /// Drops the uses the host has seen complete.
    fn prune(&mut self, host: &Clock) {
        self.pieces.retain(|_, (_, uses)| {
            uses.retain(|u| !host.covers(u.stream, u.seq));
            !uses.is_empty()
        });
    }
}

/// Where a virtual address range lives in physical memory, in the checker's own numbering:
/// every malloc region and VMM chunk gets a range of a private "physical" address space.
#[derive(Clone, Copy, Debug)]
struct Backing {
    /// Bytes.
    size: u64,
    /// First address in the private physical space.
    physical: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Per stream: its uses so far and what its next work is ordered after.
    streams: HashMap<StreamId, (u64, Clock)>,
    events: HashMap<EventId, Clock>,
    /// The uses the host has seen complete.
    host: Clock,
    /// Live malloc regions by start address.
    regions: BTreeMap<DevicePtr, Backing>,
    /// Physical chunks by handle: (bytes, physical start, mappings).
    chunks: HashMap<PhysicalHandle, (Backing, u32, bool)>,
    /// Mappings by start address: the chunk mapped there.
    mappings: BTreeMap<DevicePtr, (Backing, PhysicalHandle)>,
    next_physical: u64,
    /// Uses by virtual address (unmaps check these) and by physical address (reuse across
    /// streams and aliases).
    by_address: RangeUses,
    by_physical: RangeUses,
    /// Pieces at the last prune: the next one runs once there are twice as many.
    pruned_at: usize,
    hazards: Vec<Hazard>,
    context: String,
    /// Host synchronisations seen, `free`'s implicit ones included.
    synchronizations: u64,
}

impl State {
    fn stream(&mut self, stream: StreamId) -> &mut (u64, Clock) {
        self.streams.entry(stream).or_default()
    }

    /// What `stream` has done so far, as a clock (its own uses included).
    fn stream_clock(&mut self, stream: StreamId) -> Clock {
        let (seq, clock) = self.stream(stream).clone();
        let mut clock = clock;
        clock.raise(stream, seq);
        clock
    }

    fn backing(&mut self, size: u64) -> Backing {
        let physical = self.next_physical;
        self.next_physical += size.next_multiple_of(1 << 21) + (1 << 21);
        Backing { size, physical }
    }

    /// The host has seen everything issued so far complete.
    fn everything_complete(&mut self) {
        self.synchronizations += 1;
        // Every use of every stream is done; a stream's clock never names uses beyond another
        // stream's own count, so the counts alone are the join of all the streams' clocks.
        for (&stream, &(seq, _)) in &self.streams {
            self.host.raise(stream, seq);
        }
        self.by_address = RangeUses::default();
        self.by_physical = RangeUses::default();
        self.pruned_at = 0;
    }

    /// The physical ranges behind `[ptr, ptr + len)`, or the first address nothing backs.
    fn physical_spans(&self, ptr: DevicePtr, len: u64) -> Result<Vec<(u64, u64)>, DevicePtr> {
        let end = ptr.saturating_add(len);
        if let Some((&start, backing)) = self.regions.range(..=ptr).next_back() {
            if end <= start + backing.size {
                let at = backing.physical + (ptr - start);
                return Ok(vec![(at, at + len)]);
            }
        }
        let mut spans = Vec::new();
        let mut at = ptr;
        while at < end {
            let Some((&start, (backing, _))) = self.mappings.range(..=at).next_back() else {
                return Err(at);
            };
            if start + backing.size <= at {
                return Err(at);
            }
            let stop = end.min(start + backing.size);
            let from = backing.physical + (at - start);
            spans.push((from, from + (stop - at)));
            at = stop;
        }
        Ok(spans)
    }

    /// Records a use of `[ptr, ptr + len)` on `stream` by the device call `call`, with the
    /// hazards it meets.
    fn use_range(
        &mut self,
        call: &'static str,
        stream: StreamId,
        ptr: DevicePtr,
        len: u64,
        label: u64,
    ) {
        if len == 0 {
            return;
        }
        let host = self.host.clone();
        let entry = self.stream(stream);
        entry.1.join(&host);
        entry.0 += 1;
        let (seq, clock) = (entry.0, entry.1.clone());
        let new = Use { stream, seq, label };
        let spans = match self.physical_spans(ptr, len) {
            Ok(spans) => spans,
            Err(at) => {
                self.hazard(
                    HazardKind::IllegalAddress,
                    call,
                    (at, len),
                    Some(stream),
                    None,
                );
                return;
            }
        };
        let mut collided = None;
        let replace = |uses: &mut Vec<Use>| {
            uses.retain(|u| u.stream != stream && !clock.covers(u.stream, u.seq));
            uses.push(new);
        };
        for (lo, hi) in spans {
            self.by_physical.update(lo, hi, |uses| {
                if collided.is_none() {
                    collided = uses
                        .iter()
                        .find(|u| u.stream != stream && !clock.covers(u.stream, u.seq))
                        .map(|u| (u.stream, u.label));
                }
                replace(uses);
            });
        }
        self.by_address.update(ptr, ptr + len, |uses| replace(uses));
        if let Some(in_flight) = collided {
            self.hazard(
                HazardKind::ReusedAcrossStreams,
                call,
                (ptr, len),
                Some(stream),
                Some(in_flight),
            );
        }
        let pieces = self.by_address.pieces.len() + self.by_physical.pieces.len();
        if pieces > 2 * self.pruned_at + 4096 {
            self.by_address.prune(&self.host);
            self.by_physical.prune(&self.host);
            self.pruned_at = self.by_address.pieces.len() + self.by_physical.pieces.len();
        }
    }

    fn hazard(
        &mut self,
        kind: HazardKind,
        call: &'static str,
        range: (DevicePtr, u64),
        stream: Option<StreamId>,
        in_flight: Option<(StreamId, u64)>,
    ) {
        let context = self.context.clone();
        self.hazards.push(Hazard {
            kind,
            call,
            range,
            stream,
            in_flight,
            context,
        });
    }
}

impl HazardChecker {
    /// Watches `inner`. Declared kernels ([`HazardChecker::launch`]) take no time on it.
    pub fn new(inner: Arc<dyn Device>) -> HazardChecker {
        HazardChecker {
            inner,
            work: None,
            state: Mutex::new(State::default()),
        }
    }

    /// Runs each declared kernel's duration on the wrapped device through `work` (for the
    /// simulated device, its `enqueue_timed_work`), so that its events complete only once
    /// that work has.
    pub fn with_work(mut self, work: WorkHook) -> HazardChecker {
        self.work = Some(work);
        self
    }

    /// The wrapped device.
    pub fn inner(&self) -> &Arc<dyn Device> {
        &self.inner
    }

    /// Declares a kernel on `stream` that touches every range of `ranges` (start, bytes) and
    /// runs for `duration_ns`; `label` names it in hazards (a block or event number, say).
    pub fn launch(
        &self,
        stream: StreamId,
        ranges: &[(DevicePtr, u64)],
        duration_ns: u64,
        label: u64,
    ) -> Result<(), DeviceError> {
        {
            let mut s = self.lock();
            for &(ptr, len) in ranges {
                s.use_range("launch", stream, ptr, len, label);
            }
        }
        match &self.work {
            Some(work) => work(stream, duration_ns),
            None => Ok(()),
        }
    }

    /// Names what the caller is doing (a pool call, an event of a trace): hazards found until
    /// the next call carry it.
    pub fn set_context(&self, context: impl Into<String>) {
        self.lock().context = context.into();
    }

    /// The hazards found so far.
    pub fn hazards(&self) -> Vec<Hazard> {
        self.lock().hazards.clone()
    }

    /// Takes the hazards found so far, leaving none.
    pub fn take_hazards(&self) -> Vec<Hazard> {
        std::mem::take(&mut self.lock().hazards)
    }

    /// Host synchronisations seen so far: device and stream synchronisations, event waits and
    /// `free`'s implicit device synchronisation.
    pub fn synchronizations(&self) -> u64 {
        self.lock().synchronizations
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a copy's uses of `ranges` on `stream`.
    fn copy_uses(&self, call: &'static str, stream: StreamId, ranges: &[(DevicePtr, u64)]) {
        let mut s = self.lock();
        for &(ptr, len) in ranges {
            s.use_range(call, stream, ptr, len, u64::MAX);
        }
    }

    /// The host waited for everything issued to `stream` so far.
    fn host_waited_for(&self, stream: StreamId) {
        let mut s = self.lock();
        s.synchronizations += 1;
        let clock = s.stream_clock(stream);
        s.host.join(&clock);
    }

    fn vmm_inner(&self) -> Result<&dyn VirtualMemory, DeviceError> {
        self.inner
            .vmm()
            .ok_or_else(|| DeviceError::unsupported(self.inner.name(), "virtual memory"))
    }
}

impl Device for HazardChecker {
    fn name(&self) -> String {
        format!("{} (hazard-checked)", self.inner.name())
    }

    fn mem_info(&self) -> Result<MemInfo, DeviceError> {
        self.inner.mem_info()
    }

    fn malloc(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        let ptr = self.inner.malloc(size)?;
        let mut s = self.lock();
        let backing = s.backing(size);
        s.regions.insert(ptr, backing);
        Ok(ptr)
    }

    /// `cudaFree` synchronises the device before it frees: everything issued has completed.
    fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        self.inner.free(ptr)?;
        let mut s = self.lock();
        s.regions.remove(&ptr);
        s.everything_complete();
        Ok(())
    }

    fn vmm(&self) -> Option<&dyn VirtualMemory> {
        self.inner.vmm().map(|_| self as &dyn VirtualMemory)
    }

    fn create_stream(&self) -> Result<StreamId, DeviceError> {
        self.inner.create_stream()
    }

    fn destroy_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        self.inner.destroy_stream(stream)
    }

    fn record_event(&self, stream: StreamId) -> Result<EventId, DeviceError> {
        let event = self.inner.record_event(stream)?;
        let mut s = self.lock();
        let clock = s.stream_clock(stream);
        s.events.insert(event, clock);
        Ok(event)
    }

    fn event_completed(&self, event: EventId) -> Result<bool, DeviceError> {
        let done = self.inner.event_completed(event)?;
        if done {
            let mut s = self.lock();
            if let Some(clock) = s.events.get(&event).cloned() {
                s.host.join(&clock);
            }
        }
        Ok(done)
    }

    fn wait_event(&self, event: EventId) -> Result<(), DeviceError> {
        self.inner.wait_event(event)?;
        let mut s = self.lock();
        s.synchronizations += 1;
        if let Some(clock) = s.events.get(&event).cloned() {
            s.host.join(&clock);
        }
        Ok(())
    }

    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<(), DeviceError> {
        self.inner.stream_wait_event(stream, event)?;
        let mut s = self.lock();
        if let Some(clock) = s.events.get(&event).cloned() {
            s.stream(stream).1.join(&clock);
        }
        Ok(())
    }

    fn destroy_event(&self, event: EventId) -> Result<(), DeviceError> {
        self.inner.destroy_event(event)?;
        self.lock().events.remove(&event);
        Ok(())
    }

    fn synchronize_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        self.inner.synchronize_stream(stream)?;
        self.host_waited_for(stream);
        Ok(())
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        self.inner.synchronize()?;
        self.lock().everything_complete();
        Ok(())
    }

    fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: &[u8],
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        self.copy_uses("copy_to_device", stream, &[(dst, src.len() as u64)]);
        self.inner.copy_to_device(dst, src, stream)?;
        self.host_waited_for(stream);
        Ok(())
    }

    fn copy_to_host(
        &self,
        dst: &mut [u8],
        src: DevicePtr,
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        self.copy_uses("copy_to_host", stream, &[(src, dst.len() as u64)]);
        self.inner.copy_to_host(dst, src, stream)?;
        self.host_waited_for(stream);
        Ok(())
    }

    fn copy_on_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        self.copy_uses("copy_on_device", stream, &[(dst, len), (src, len)]);
        self.inner.copy_on_device(dst, src, len, stream)?;
        self.host_waited_for(stream);
        Ok(())
    }

    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuffer, DeviceError> {
        self.inner.alloc_pinned(len)
    }

    fn alloc_managed(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        let ptr = self.inner.alloc_managed(size)?;
        let mut s = self.lock();
        let backing = s.backing(size);
        s.regions.insert(ptr, backing);
        Ok(ptr)
    }

    fn free_managed(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        self.inner.free_managed(ptr)?;
        let mut s = self.lock();
        s.regions.remove(&ptr);
        s.everything_complete();
        Ok(())
    }

    fn prefetch_managed(
        &self,
        ptr: DevicePtr,
        len: u64,
        to: MemoryLocation,
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        self.inner.prefetch_managed(ptr, len, to, stream)
    }

    fn advise_managed(
        &self,
        ptr: DevicePtr,
        len: u64,
        advice: ManagedAdvice,
    ) -> Result<(), DeviceError> {
        self.inner.advise_managed(ptr, len, advice)
    }

    /// Passed on; the copy is a use of `dst` on `stream`. Its buffer comes back through the
    /// wrapped device, so the checker does not learn when the copy completes (it stays in
    /// flight until a synchronisation: stricter, never laxer).
    fn copy_to_device_async(
        &self,
        dst: DevicePtr,
        src: PinnedBuffer,
        stream: StreamId,
    ) -> Result<InFlight<'_, PinnedBuffer>, DeviceError> {
        self.copy_uses("copy_to_device_async", stream, &[(dst, src.len() as u64)]);
        self.inner.copy_to_device_async(dst, src, stream)
    }

    /// Passed on; the copy is a use of `src` on `stream` (see
    /// [`HazardChecker::copy_to_device_async`]).
    fn copy_to_host_async(
        &self,
        dst: PinnedBuffer,
        src: DevicePtr,
        stream: StreamId,
    ) -> Result<InFlight<'_, PinnedBuffer>, DeviceError> {
        self.copy_uses("copy_to_host_async", stream, &[(src, dst.len() as u64)]);
        self.inner.copy_to_host_async(dst, src, stream)
    }

    fn copy_on_device_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<EventId, DeviceError> {
        self.copy_uses("copy_on_device_async", stream, &[(dst, len), (src, len)]);
        let event = self.inner.copy_on_device_async(dst, src, len, stream)?;
        let mut s = self.lock();
        let clock = s.stream_clock(stream);
        s.events.insert(event, clock);
        Ok(event)
    }
}

impl VirtualMemory for HazardChecker {
    fn granularity(&self) -> u64 {
        self.inner.vmm().map_or(1, |v| v.granularity())
    }

    fn reserve(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        self.vmm_inner()?.reserve(size)
    }

    fn release_reservation(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        self.vmm_inner()?.release_reservation(ptr, size)
    }

    fn create_physical(&self, size: u64) -> Result<PhysicalHandle, DeviceError> {
        let handle = self.vmm_inner()?.create_physical(size)?;
        let mut s = self.lock();
        let backing = s.backing(size);
        s.chunks.insert(handle, (backing, 0, false));
        Ok(handle)
    }

    fn release_physical(&self, handle: PhysicalHandle) -> Result<(), DeviceError> {
        self.vmm_inner()?.release_physical(handle)?;
        let mut s = self.lock();
        if let Some(chunk) = s.chunks.get_mut(&handle) {
            chunk.2 = true;
            if chunk.1 == 0 {
                let backing = chunk.0;
                s.chunks.remove(&handle);
                let end = backing.physical + backing.size;
                s.by_physical.remove(backing.physical, end);
            }
        }
        Ok(())
    }

    fn map(&self, ptr: DevicePtr, handle: PhysicalHandle) -> Result<(), DeviceError> {
        self.vmm_inner()?.map(ptr, handle)?;
        let mut s = self.lock();
        if let Some(chunk) = s.chunks.get_mut(&handle) {
            chunk.1 += 1;
            let backing = chunk.0;
            s.mappings.insert(ptr, (backing, handle));
        }
        Ok(())
    }

    /// Checks that every use of the range has been seen complete, then passes the call on.
    fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        {
            let mut s = self.lock();
            let end = ptr.saturating_add(size);
            let host = s.host.clone();
            let pending = s
                .by_address
                .uses_in(ptr, end)
                .find(|u| !host.covers(u.stream, u.seq))
                .map(|u| (u.stream, u.label));
            if let Some(in_flight) = pending {
                s.hazard(
                    HazardKind::UnmappedInFlight,
                    "unmap",
                    (ptr, size),
                    None,
                    Some(in_flight),
                );
            }
        }
        self.vmm_inner()?.unmap(ptr, size)?;
        let mut s = self.lock();
        let end = ptr.saturating_add(size);
        s.by_address.remove(ptr, end);
        let starts: Vec<DevicePtr> = s.mappings.range(ptr..end).map(|(&a, _)| a).collect();
        for start in starts {
            let (_, handle) = s.mappings.remove(&start).expect("listed above");
            if let Some(chunk) = s.chunks.get_mut(&handle) {
                chunk.1 -= 1;
                if chunk.1 == 0 && chunk.2 {
                    let backing = chunk.0;
                    s.chunks.remove(&handle);
                    let end = backing.physical + backing.size;
                    s.by_physical.remove(backing.physical, end);
                }
            }
        }
        Ok(())
    }
}
