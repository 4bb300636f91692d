//! gpumem's HTML report: replays of one or more traces (one per rank of a job) through the
//! allocator policies, or a plan, as one self-contained page that opens offline from a file.
//!
//! [`build`] replays the traces and gathers what the page shows ([`Report`]): per policy the
//! figures of `gpumem replay`, allocated, reserved and fragmentation over time (reduced to
//! min/max buckets for drawing only, [`Series`]), the segment map at the peak, where it runs
//! out of memory at a capacity; the largest live allocations at the trace's peak; the `tune`
//! table when asked. [`render`] turns it into HTML with inline style and script (charts drawn
//! on canvases by our own code, no library); [`render_plan`] does the same for a plan; and
//! [`write_atomically`] writes a page so that no partial file is left behind.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod html;
mod model;
mod output;
mod plan;
mod series;

pub use html::render;
pub use model::{
    build, AllocGroup, FrameGroup, FrameView, LargestLive, MapView, PolicyView, RangeState,
    RankReport, Report, ReportError, ReportOptions, SegmentDraw, StackView, StepMark,
    DEFAULT_BUCKETS, MAP_CELLS,
};
pub use output::{check_output, write_atomically};
pub use plan::render_plan;
pub use series::Series;
