//! The DNS agent's zone loop: build the zone from the objects, and on every change build a
//! new one and swap it in whole.
//!
//! [`ZoneLoop`] is generic over its object source ([`ZoneView`]: in `weir dns`, weir-source's
//! `SharedStore`, already holding one complete view) and where zones go ([`ZoneTarget`]:
//! [`ZoneHandle`], which the server answers from). The SOA serial follows a wall clock
//! ([`ZoneBuilder::with_clock`]), so tests set the time. The `weir dns` binary keeps the flags,
//! starting the source, the health and metrics listeners and the server.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tracing::{info, warn};
use weir_model::conditions::Conditions;
use weir_model::Snapshot;

use crate::{DnsMetrics, Zone, ZoneConfig, ZoneHandle};

/// Where the objects come from. The objects are shared, not copied: the store's own maps
/// (`SharedStore::shared_snapshot`), so a zone build holds no second copy of them (12 MB at
/// 100,000 services).
pub trait ZoneView {
    /// (generation, every object) now.
    fn snapshot(&self) -> (u64, Arc<Snapshot>);
    /// Waits until the generation exceeds `seen` (then returns it and the objects) or
    /// `timeout` passes.
    fn wait_newer(&self, seen: u64, timeout: Duration) -> Option<(u64, Arc<Snapshot>)>;
}

/// Where built zones go.
pub trait ZoneTarget {
    /// Replaces the zone being served.
    fn store(&self, zone: Zone);
}

impl ZoneTarget for ZoneHandle {
    fn store(&self, zone: Zone) {
        ZoneHandle::store(self, zone)
    }
}

/// A serial that grows with every rebuild and across restarts (the clock), like CoreDNS's.
pub fn next_serial(previous: u32, now: SystemTime) -> u32 {
    let now = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as u32)
        .unwrap_or(0);
    now.max(previous.wrapping_add(1))
}

/// Builds zones: bumps the serial, says zone warnings when they appear, change and clear,
/// logs and counts each build.
pub struct ZoneBuilder {
    config: ZoneConfig,
    metrics: Arc<DnsMetrics>,
    /// Zone warnings hold as long as the objects behind them: said when they appear or
    /// change and when they clear, not on every rebuild.
    warnings: Conditions,
    clock: Box<dyn Fn() -> SystemTime + Send>,
}

impl ZoneBuilder {
    pub fn new(config: ZoneConfig, metrics: Arc<DnsMetrics>) -> Self {
        Self {
            config,
            metrics,
            warnings: Conditions::default(),
            clock: Box::new(SystemTime::now),
        }
    }

    /// The wall clock the serial follows (default: [`SystemTime::now`]).
    pub fn with_clock(mut self, clock: impl Fn() -> SystemTime + Send + 'static) -> Self {
        self.clock = Box::new(clock);
        self
    }

    pub fn build(&mut self, snapshot: &Snapshot) -> Zone {
        let config = &mut self.config;
        config.serial = next_serial(config.serial, (self.clock)());
        let zone = Zone::build(snapshot, config);
        let said = self
            .warnings
            .update(zone.warnings.iter().map(String::as_str));
        for w in said.cleared {
            info!("zone: resolved: {w}");
        }
        for w in said.appeared {
            warn!("zone: {w}");
        }
        info!(
            services = snapshot.services.len(),
            names = zone.name_count(),
            serial = config.serial,
            "zone built"
        );
        self.metrics.zone_built(&zone);
        zone
    }
}

/// The zone loop.
pub struct ZoneLoop<V> {
    builder: ZoneBuilder,
    view: V,
    seen: u64,
}

/// How long one wait for a change lasts before waiting again.
const WAIT: Duration = Duration::from_secs(60);

impl<V: ZoneView> ZoneLoop<V> {
    pub fn new(builder: ZoneBuilder, view: V) -> Self {
        Self {
            builder,
            view,
            seen: 0,
        }
    }

    pub fn view(&self) -> &V {
        &self.view
    }

    /// The zone of the objects now (the first, built before serving).
    pub fn build(&mut self) -> Zone {
        let (generation, snapshot) = self.view.snapshot();
        self.seen = generation;
        // Each snapshot is dropped before its zone is swapped in: while it is held, a change
        // to the store copies the store's maps.
        self.builder.build(&snapshot)
    }

    /// Waits up to `timeout` for a change; on one, builds the new zone and hands it to
    /// `target`. True when it did.
    pub fn update(&mut self, target: &impl ZoneTarget, timeout: Duration) -> bool {
        let Some((generation, snapshot)) = self.view.wait_newer(self.seen, timeout) else {
            return false;
        };
        self.seen = generation;
        let zone = self.builder.build(&snapshot);
        drop(snapshot);
        target.store(zone);
        true
    }

    /// Follows the objects for good.
    pub fn run(mut self, target: impl ZoneTarget) -> ! {
        loop {
            self.update(&target, WAIT);
        }
    }
}
