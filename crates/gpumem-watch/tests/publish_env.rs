//! `GPUMEM_PUBLISH=1` turns publishing of the process-wide registry on, in the directory
//! `GPUMEM_PUBLISH_DIR` names, where watchers look by default. One test in its own process:
//! it sets the environment.

use std::sync::Arc;

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_pool::{global_registry, Pool, PoolConfig};
use gpumem_watch::publish::{endpoint_dir, publish_from_env, DIR_VAR, PUBLISH_VAR};
use gpumem_watch::PoolEndpoints;

#[test]
fn the_environment_switches_publishing_of_the_global_registry() {
    let dir = tempfile::tempdir().unwrap();
    std::env::set_var(DIR_VAR, dir.path());
    assert_eq!(endpoint_dir(), dir.path());

    std::env::remove_var(PUBLISH_VAR);
    assert!(publish_from_env().unwrap().is_none(), "off by default");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "and creates nothing"
    );

    std::env::set_var(PUBLISH_VAR, "maybe");
    let error = publish_from_env().err().unwrap();
    assert!(
        error
            .to_string()
            .contains("GPUMEM_PUBLISH=\"maybe\" is not accepted"),
        "{error}"
    );

    let device = Arc::new(SimDevice::new(SimConfig::address_only(1 << 30)).unwrap());
    global_registry().set(
        0,
        Arc::new(Pool::new(device, PoolConfig::default()).unwrap()),
    );
    std::env::set_var(PUBLISH_VAR, "1");
    let publisher = publish_from_env().unwrap().expect("publishing is on");
    let pools = PoolEndpoints::from_env().pools().unwrap();
    assert_eq!(pools.len(), 1);
    assert_eq!(pools[0].pid, std::process::id());
    drop(publisher);
}
