//! Device IDs advertised to kubelet: `<uuid>-core-<k>` (100 per card) and
//! `<uuid>-mem-<k>` (one per memory unit of the card).

use vgpu_node_agent::state::AllocationRecord;

/// Core devices per card: one per percent of its SMs.
pub const CORES_PER_CARD: u32 = 100;

/// Which of the two resources an ID belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `tencent.com/vcuda-core`: one ID per percent of a card's SMs (`<uuid>-core-<k>`).
    Core,
    /// `tencent.com/vcuda-memory`: one ID per `memory_unit` of a card's memory
    /// (`<uuid>-mem-<k>`).
    Memory,
}

impl Kind {
    fn infix(self) -> &'static str {
        match self {
            Kind::Core => "-core-",
            Kind::Memory => "-mem-",
        }
    }

    /// The other resource.
    pub fn other(self) -> Kind {
        match self {
            Kind::Core => Kind::Memory,
            Kind::Memory => Kind::Core,
        }
    }
}

/// One parsed device ID.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    /// The card's NVML UUID (`GPU-…`).
    pub uuid: String,
    /// Which resource the ID is of.
    pub kind: Kind,
    /// The ID's number on its card: 0-99 for cores, 0 up to the card's memory units for
    /// memory.
    pub unit: u32,
}

impl DeviceId {
    pub(crate) fn new(uuid: &str, kind: Kind, unit: u32) -> DeviceId {
        DeviceId {
            uuid: uuid.to_string(),
            kind,
            unit,
        }
    }

    /// Parses `<uuid>-core-<k>` or `<uuid>-mem-<k>`; `None` for anything else.
    pub fn parse(text: &str) -> Option<DeviceId> {
        for kind in [Kind::Core, Kind::Memory] {
            if let Some(at) = text.rfind(kind.infix()) {
                let (uuid, rest) = text.split_at(at);
                let digits = &rest[kind.infix().len()..];
                if uuid.is_empty()
                    || digits.is_empty()
                    || !digits.bytes().all(|b| b.is_ascii_digit())
                {
                    continue;
                }
                let unit = digits.parse().ok()?;
                return Some(DeviceId {
                    uuid: uuid.to_string(),
                    kind,
                    unit,
                });
            }
        }
        None
    }
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}{}", self.uuid, self.kind.infix(), self.unit)
    }
}

/// What a record's device IDs say in the device plugin's terms.
pub trait RecordIds {
    /// Core request of 100×N: N whole cards.
    fn is_whole_card(&self) -> bool;
    /// The IDs of one resource.
    fn ids(&self, kind: Kind) -> &[String];
}

impl RecordIds for AllocationRecord {
    fn is_whole_card(&self) -> bool {
        !self.core_ids.is_empty() && (self.core_ids.len() as u32).is_multiple_of(CORES_PER_CARD)
    }

    fn ids(&self, kind: Kind) -> &[String] {
        match kind {
            Kind::Core => &self.core_ids,
            Kind::Memory => &self.memory_ids,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_garbage() {
        let uuid = "GPU-5e0f0c5a-1111-2222-3333-444455556666";
        for kind in [Kind::Core, Kind::Memory] {
            let id = DeviceId::new(uuid, kind, 42);
            assert_eq!(DeviceId::parse(&id.to_string()), Some(id));
        }
        assert_eq!(DeviceId::parse("GPU-x-core-").map(|id| id.unit), None);
        assert_eq!(DeviceId::parse("-core-3"), None);
        assert_eq!(DeviceId::parse("GPU-x-core-3a"), None);
        assert_eq!(DeviceId::parse("nvidia0"), None);
        assert_eq!(DeviceId::parse("GPU-x-mem-99999999999999"), None);
    }
}
