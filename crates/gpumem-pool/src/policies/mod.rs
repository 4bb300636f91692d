//! The built-in placement policies, one per file, built by [`PolicyKind::build`]. A policy
//! from outside this crate implements [`crate::Policy`] and goes to
//! [`crate::Pool::with_policy`] directly.

mod gpumem;
mod options;
mod passthrough;
mod slots;
mod torch;
pub mod torch_settings;

pub use gpumem::{GpumemPolicy, GpumemSettings};
pub use passthrough::PassthroughPolicy;
pub use torch::rounding as torch_rounding;
pub use torch::TorchPolicy;

use crate::config::{ConfigError, PolicyKind, PoolConfig};
use crate::policies::torch_settings::TorchSettings;
use crate::policy::Policy;

impl PolicyKind {
    /// A fresh policy of this kind with the settings of `config` that apply to it; an error
    /// naming the setting when they are not valid.
    pub fn build(self, config: &PoolConfig) -> Result<Box<dyn Policy>, ConfigError> {
        Ok(match self {
            PolicyKind::None => Box::new(PassthroughPolicy::default()),
            PolicyKind::Torch => Box::new(TorchPolicy::new(config.torch.clone())),
            PolicyKind::Expandable => Box::new(TorchPolicy::new(TorchSettings {
                expandable_segments: true,
                ..config.torch.clone()
            })),
            PolicyKind::Gpumem => Box::new(GpumemPolicy::new(config.gpumem)?),
        })
    }
}
