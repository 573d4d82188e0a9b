//! The async face's one way to open a connection, bounding the whole attempt by
//! `connect_timeout` as libpq does: tokio-postgres bounds only the TCP connect, and
//! diesel-async drops the driver's reason, which is kept here as the source.

use crate::error::Repr;
use diesel_async::AsyncPgConnection;

use tokio_postgres::config::{Config, Host, LoadBalanceHosts};

use crate::error::LeaseError;
use crate::libpq::{with_connect_timeout, ConnectBound};

/// Opens an `AsyncPgConnection` to `database_url`, each host tried in turn as libpq
/// does and bounded by `connect_timeout` (the sync rule, same code), so a hung old
/// primary does not keep a failover URL from the new one. Use it instead of `establish`.
pub async fn connect(database_url: &str) -> Result<AsyncPgConnection, LeaseError> {
    let bound = ConnectBound::of(database_url);
    let config: Config = with_connect_timeout(database_url)
        .parse()
        .map_err(LeaseError::connect)?;
    let mut reason = None;
    for host in one_config_per_host(&config) {
        let attempt = async {
            let (client, connection) = host
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(LeaseError::connect)?;
            AsyncPgConnection::try_from_client_and_connection(client, connection)
                .await
                .map_err(LeaseError::connect)
        };
        let result = match bound.each {
            None => attempt.await,
            // Dropping the attempt closes its socket.
            Some(each) => match tokio::time::timeout(each, attempt).await {
                Ok(result) => result,
                Err(_elapsed) => continue,
            },
        };
        match result {
            Ok(connection) => return Ok(connection),
            Err(error) => reason = Some(error),
        }
    }
    Err(reason.unwrap_or(LeaseError::from(Repr::ConnectTimedOut {
        servers: bound.servers,
        after: bound.total.unwrap_or_default(),
        setting: bound.setting,
    })))
}

/// `config` split into one configuration per host, in tokio-postgres's order.
fn one_config_per_host(config: &Config) -> Vec<Config> {
    let hosts = config.get_hosts();
    let addresses = config.get_hostaddrs();
    let count = hosts.len().max(addresses.len());
    if count <= 1 {
        return vec![config.clone()];
    }
    let mut order: Vec<usize> = (0..count).collect();
    if config.get_load_balance_hosts() == LoadBalanceHosts::Random {
        shuffle(&mut order);
    }
    order.into_iter().map(|n| for_host(config, n)).collect()
}

/// `config` with only host number `n` (one port given serves every host).
fn for_host(config: &Config, n: usize) -> Config {
    let mut one = Config::new();
    if let Some(user) = config.get_user() {
        one.user(user);
    }
    if let Some(password) = config.get_password() {
        one.password(password);
    }
    if let Some(dbname) = config.get_dbname() {
        one.dbname(dbname);
    }
    if let Some(options) = config.get_options() {
        one.options(options);
    }
    if let Some(name) = config.get_application_name() {
        one.application_name(name);
    }
    match config.get_hosts().get(n) {
        Some(Host::Tcp(name)) => {
            one.host(name);
        }
        Some(Host::Unix(directory)) => {
            one.host_path(directory);
        }
        None => {}
    }
    if let Some(address) = config.get_hostaddrs().get(n) {
        one.hostaddr(*address);
    }
    let ports = config.get_ports();
    let port = if ports.len() == 1 {
        ports.first()
    } else {
        ports.get(n)
    };
    if let Some(port) = port {
        one.port(*port);
    }
    if let Some(timeout) = config.get_connect_timeout() {
        one.connect_timeout(*timeout);
    }
    if let Some(timeout) = config.get_tcp_user_timeout() {
        one.tcp_user_timeout(*timeout);
    }
    if let Some(interval) = config.get_keepalives_interval() {
        one.keepalives_interval(interval);
    }
    if let Some(retries) = config.get_keepalives_retries() {
        one.keepalives_retries(retries);
    }
    one.ssl_mode(config.get_ssl_mode())
        .ssl_negotiation(config.get_ssl_negotiation())
        .keepalives(config.get_keepalives())
        .keepalives_idle(config.get_keepalives_idle())
        .target_session_attrs(config.get_target_session_attrs())
        .channel_binding(config.get_channel_binding())
        .load_balance_hosts(config.get_load_balance_hosts());
    one
}

/// Fisher-Yates from std's per-process random hash keys: no random-number crate.
fn shuffle(order: &mut [usize]) {
    use std::hash::{BuildHasher, Hasher};
    let keys = std::collections::hash_map::RandomState::new();
    for last in (1..order.len()).rev() {
        let mut hasher = keys.build_hasher();
        hasher.write_usize(last);
        let pick = usize::try_from(hasher.finish() % (last as u64 + 1)).unwrap_or(0);
        order.swap(last, pick);
    }
}

/// [`connect`] for the pool's manager, the reason kept in diesel's error text.
pub(super) async fn connect_for_pool(
    database_url: &str,
) -> diesel::ConnectionResult<AsyncPgConnection> {
    connect(database_url)
        .await
        .map_err(|error| match error.into_repr() {
            Repr::Connect { source, .. } => match source.downcast::<diesel::ConnectionError>() {
                Ok(setup) => *setup,
                Err(other) => {
                    diesel::ConnectionError::BadConnection(crate::libpq::chain(other.as_ref()))
                }
            },
            other => diesel::ConnectionError::BadConnection(other.to_string()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host configuration's host, address, port and shared settings.
    fn described(config: &Config) -> String {
        format!(
            "{:?} {:?} {:?} user={:?} db={:?} timeout={:?} attrs={:?} app={:?}",
            config.get_hosts(),
            config.get_hostaddrs(),
            config.get_ports(),
            config.get_user(),
            config.get_dbname(),
            config.get_connect_timeout(),
            config.get_target_session_attrs(),
            config.get_application_name(),
        )
    }

    fn split(url: &str) -> Vec<String> {
        let config: Config = url.parse().expect("a URL tokio-postgres reads");
        one_config_per_host(&config).iter().map(described).collect()
    }

    #[test]
    fn each_host_keeps_its_own_port_and_address_and_every_shared_setting() {
        let hosts = split(
            "postgres://app@db1:5433,db2:5434/orders?connect_timeout=2\
             &target_session_attrs=read-write&application_name=billing",
        );
        assert_eq!(hosts.len(), 2);
        assert!(hosts[0].starts_with(r#"[Tcp("db1")] [] [5433] user=Some("app") db=Some("orders") timeout=Some(2s) attrs=ReadWrite app=Some("billing")"#), "{}", hosts[0]);
        assert!(
            hosts[1].starts_with(r#"[Tcp("db2")] [] [5434] "#),
            "{}",
            hosts[1]
        );
        let sockets = split("host=/run/a,/run/b port=5499 hostaddr=10.0.0.1,10.0.0.2 user=u");
        assert_eq!(
            sockets
                .iter()
                .map(|host| host.split(" user=").next().unwrap_or_default().to_owned())
                .collect::<Vec<_>>(),
            [
                r#"[Unix("/run/a")] [10.0.0.1] [5499]"#,
                r#"[Unix("/run/b")] [10.0.0.2] [5499]"#
            ],
            "one port serves every host"
        );
        let single = split("postgres://u@db1/x");
        assert_eq!(single.len(), 1);
        assert!(
            single[0].starts_with(r#"[Tcp("db1")] [] [5432]"#),
            "{}",
            single[0]
        );
    }

    #[test]
    fn a_random_order_keeps_every_host_once() {
        let mut in_order = split("postgres://u@h1,h2,h3,h4,h5/x?load_balance_hosts=random");
        in_order.sort();
        let mut orders = std::collections::BTreeSet::new();
        for _ in 0..50 {
            let hosts = split("postgres://u@h1,h2,h3,h4,h5/x?load_balance_hosts=random");
            orders.insert(hosts.clone());
            let mut sorted = hosts;
            sorted.sort();
            assert_eq!(sorted, in_order, "every host, once");
        }
        assert!(orders.len() > 1, "50 shuffles of five hosts gave one order");
    }
}
