//! The assembly of an engine from the members a builder was given: each member opened (a URL
//! parsed, or a client of the user's kept with our TCP settings), duplicates refused, one
//! [`Node`] per member with the node settings, the engine made over them.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::Engine;
use super::config::Config;
use crate::error::ConfigError;
use crate::node::address::{node_name, redact};
pub(crate) use crate::node::connection::Tls;
use crate::node::connection::{open_client, tcp_settings};
use crate::node::member::{self, Parsed};
use crate::node::{MaxTtl, Node, NodeSettings, Peers};

impl Engine {
    /// The engine over `members`, in order, with the checked configuration: each member
    /// opened, a second URL of one member refused, the node count warned about when it
    /// tolerates no more failures than a smaller one. `scripted` (tests) names the members
    /// kept on the acquire script.
    pub(crate) fn assemble(
        members: &[Source],
        cfg: Config,
        max_ttl: Option<Duration>,
        tls: &Tls,
        scripted: &[usize],
    ) -> Result<Engine, ConfigError> {
        let max_ttl = Arc::new(MaxTtl::new(max_ttl));
        let mut seen = HashSet::new();
        let mut clients = Vec::with_capacity(members.len());
        for (position, source) in members.iter().enumerate() {
            let Parsed {
                name,
                identity,
                member,
            } = open_member(source, position + 1, cfg.connect_timeout, tls)?;
            if !seen.insert(identity) {
                return Err(ConfigError::DuplicateNode(name));
            }
            clients.push((name, member));
        }
        let settings = cfg.node_settings();
        // URLs that differ can still reach one server: the nodes compare run ids on connect.
        let peers = Arc::new(Peers::new(clients.iter().map(|(name, _)| name.clone())));
        let nodes: Vec<Arc<Node>> = clients
            .into_iter()
            .enumerate()
            .map(|(index, (name, client))| {
                Arc::new(Node::new(
                    name,
                    client,
                    settings_of(&settings, index, scripted),
                    Arc::clone(&max_ttl),
                    index,
                    Arc::clone(&peers),
                ))
            })
            .collect();
        if nodes.len() == 1 {
            tracing::warn!(
                "one node is no quorum: the lock is unavailable while it is down and lost when it \
                 loses its data; prefer 3 or 5 independent nodes"
            );
        } else if nodes.len().is_multiple_of(2) {
            tracing::warn!(
                nodes = nodes.len(),
                "an even number of nodes tolerates no more failures than {}; prefer an odd count",
                nodes.len() - 1
            );
        }
        Ok(Engine::from_parts(nodes, cfg, max_ttl))
    }
}

/// What the member at `index` is given: the client's node settings, and (feature
/// `testkit`) whether a test keeps it on the acquire script.
fn settings_of(settings: &NodeSettings, index: usize, scripted: &[usize]) -> NodeSettings {
    #[cfg(feature = "testkit")]
    return NodeSettings {
        force_script: scripted.contains(&index),
        ..settings.clone()
    };
    #[cfg(not(feature = "testkit"))]
    {
        let _ = (index, scripted);
        settings.clone()
    }
}

/// Opens one member as given: a URL parsed (a Cluster or Sentinel member URL, else one
/// server), or a client of the user's, kept with our TCP settings (`node/member.rs`).
fn open_member(
    source: &Source,
    position: usize,
    connect_timeout: Duration,
    tls: &Tls,
) -> Result<Parsed, ConfigError> {
    match source {
        Source::Url(url) => {
            let invalid = |source| ConfigError::InvalidUrl {
                url: redact(url),
                source,
            };
            // A Redis Cluster or a Sentinel-managed primary as one member.
            if let Some(parsed) =
                member::parse(url, &tcp_settings(), connect_timeout).map_err(invalid)?
            {
                return Ok(parsed);
            }
            Ok(member::standalone(open_client(url, tls)?))
        }
        Source::Client(client) => {
            member::from_client(client, &tcp_settings()).map_err(|source| ConfigError::InvalidUrl {
                url: node_name(client.get_connection_info()),
                source,
            })
        }
        Source::Cluster(client) => Ok(member::from_cluster_client((**client).clone(), position)),
    }
}

/// One member as given to the builder.
#[derive(Clone)]
pub(crate) enum Source {
    /// A member URL (`redis://`, `rediss://`, `unix://`, `redis+cluster://`, `redis+sentinel://`).
    Url(String),
    /// A standalone master through the user's client.
    Client(Box<redis::Client>),
    /// A Redis Cluster through the user's cluster client.
    Cluster(Box<redis::cluster::ClusterClient>),
}

impl std::fmt::Debug for Source {
    /// Never a password: URLs redacted, clients by their display name.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Url(url) => f.debug_tuple("Url").field(&redact(url)).finish(),
            Source::Client(client) => f
                .debug_tuple("Client")
                .field(&node_name(client.get_connection_info()))
                .finish(),
            Source::Cluster(_) => f.write_str("ClusterClient"),
        }
    }
}
