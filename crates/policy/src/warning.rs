//! What conversion found wrong with an object, and what weir enforces instead.
//!
//! The API server rejects nearly all of these at admission; they reach weir through the
//! manifest directory, or from an API server newer than this code (a new protocol). Each
//! warning names the object, the field and the outcome, and no outcome allows more than the
//! object meant to allow.

use std::fmt;

use crate::key::ObjectKey;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("unknown protocol {0:?} (TCP, UDP or SCTP)")]
    UnknownProtocol(String),
    #[error("invalid CIDR {0:?}")]
    InvalidCidr(String),
    #[error("unknown selector operator {0:?} (In, NotIn, Exists or DoesNotExist)")]
    UnknownSelectorOperator(String),
    #[error("selector operator {0} needs values")]
    SelectorValuesRequired(String),
    #[error("selector operator {0} takes no values")]
    SelectorValuesForbidden(String),
    #[error("{0:?} is not a valid IANA service name")]
    InvalidPortName(String),
    #[error("port {0} is outside 1-65535")]
    InvalidPort(i32),
    #[error("endPort {end} is below port {port} or above 65535")]
    InvalidEndPort { port: i32, end: i32 },
    #[error("endPort needs a numeric port")]
    EndPortWithoutNumber,
    #[error("a peer needs exactly one of ipBlock or pod/namespace selectors")]
    MalformedPeer,
    #[error("unknown policy type {0:?} (Ingress or Egress)")]
    UnknownPolicyType(String),
    #[error("invalid IP {0:?}")]
    InvalidIp(String),
    #[error("named port {name:?} ({protocol}) is both {first} and {second}")]
    ConflictingNamedPort {
        name: String,
        protocol: &'static str,
        first: u16,
        second: u16,
    },
}

/// What weir enforces in place of what it could not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The peer matches nothing; the rule's other peers stay.
    PeerAllowsNothing,
    /// The port entry matches nothing; the rule's other ports stay (a rule left with none
    /// allows nothing, never every port).
    PortAllowsNothing,
    /// The policy's own podSelector is unreadable: it isolates every pod of its namespace in
    /// its directions and allows nothing.
    PolicyIsolatesNamespace,
    /// An unknown policy type: the policy isolates both directions (its rules stay).
    PolicyIsolatesBothDirections,
    /// A pod's address or container port is ignored.
    Ignored,
    /// A pod's named port resolves to nothing: policies naming it allow nothing through it.
    NamedPortUnresolved,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::PeerAllowsNothing => "this peer allows nothing",
            Outcome::PortAllowsNothing => "this port allows nothing",
            Outcome::PolicyIsolatesNamespace => {
                "the policy isolates every pod in its namespace and allows nothing"
            }
            Outcome::PolicyIsolatesBothDirections => "the policy isolates ingress and egress",
            Outcome::Ignored => "ignored",
            Outcome::NamedPortUnresolved => "policies naming this port allow nothing through it",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// `NetworkPolicy` or `Pod`.
    pub kind: &'static str,
    pub object: ObjectKey,
    /// The field's path, e.g. `spec.ingress[0].from[1].ipBlock.cidr`.
    pub field: String,
    pub problem: Problem,
    pub outcome: Outcome,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}: {}: {}: {}",
            self.kind, self.object, self.field, self.problem, self.outcome
        )
    }
}
