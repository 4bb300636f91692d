//! Placement policies, one per file, chosen at run time by [`crate::PolicyKind`].

mod gpumem;
mod options;
mod passthrough;
mod slots;
mod torch;
pub mod torch_settings;

pub use gpumem::{GpumemPolicy, GpumemSettings};
pub use passthrough::PassthroughPolicy;
pub use torch::TorchPolicy;

use crate::config::{PolicyKind, PoolConfig};
use crate::policy::Policy;

/// The policy `config` asks for.
pub fn build(config: &PoolConfig) -> Box<dyn Policy> {
    match config.policy {
        PolicyKind::None => Box::new(PassthroughPolicy::default()),
        PolicyKind::Torch => Box::new(TorchPolicy::new(config.torch.clone())),
        PolicyKind::Expandable => Box::new(TorchPolicy::new(
            crate::policies::torch_settings::TorchSettings {
                expandable_segments: true,
                ..config.torch.clone()
            },
        )),
        PolicyKind::Gpumem => Box::new(GpumemPolicy::default()),
    }
}
