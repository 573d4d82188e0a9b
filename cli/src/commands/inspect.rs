//! `leasehold inspect KEY`: one key's state, in the words `ls` uses.

use leasehold::{LeaseState, Leases};

use crate::connect::Needs;
use crate::context::Context;
use crate::failure::CliError;
use crate::help::SEE_EXIT_CODES;
use crate::json::Json;
use crate::table;

/// Show KEY's state: holder, epoch, expiry (advisory, may be stale).
#[derive(Debug, clap::Args)]
#[command(after_help = SEE_EXIT_CODES)]
pub struct Args {
    /// The lease key.
    key: String,
}

/// `leasehold inspect KEY`. A never-leased key is a normal answer (exit 0).
pub fn run(args: Args, ctx: &Context) -> Result<(), CliError> {
    let mut session = ctx.connect(Needs::Installed)?;
    let conn = &mut session.conn;
    let out = ctx.out;
    let key = args.key.as_str();
    if key.is_empty() {
        return Err(CliError::InvalidInput("KEY must not be empty".into()));
    }
    let Some(state) = conn.inspect(key).map_err(CliError::from)? else {
        let text = format!("{key} was never leased (no row); the first grant will be epoch 1");
        let json = Json::Object(vec![
            ("key", Json::str(key)),
            ("exists", Json::Bool(false)),
            ("state", Json::Null),
            ("held", Json::Bool(false)),
            ("owner", Json::Null),
            ("epoch", Json::Null),
            ("expires_at", Json::Null),
        ]);
        return Ok(out.emit(&text, &json)?);
    };
    // The words `leasehold ls` prints: the holder and expiry of a grant,
    // held or lapsed; how a free key's last grant ended.
    let (owner, expires_at, ended) = match &state {
        LeaseState::Held {
            owner, expires_at, ..
        } => (Some(owner.as_str()), Some(*expires_at), None),
        LeaseState::Lapsed {
            owner, expired_at, ..
        } => (Some(owner.as_str()), Some(*expired_at), None),
        LeaseState::Free { force_released, .. } => (
            None,
            None,
            Some(if *force_released {
                "force_released"
            } else {
                "released"
            }),
        ),
    };
    let text = table::render(
        &["KEY", "STATE", "HOLDER", "EPOCH", "EXPIRES_AT", "ENDED"],
        &[vec![
            key.to_owned(),
            state.as_str().into(),
            owner.unwrap_or("-").into(),
            state.epoch().to_string(),
            expires_at.map_or_else(|| "-".into(), |at| at.to_string()),
            ended.unwrap_or("-").into(),
        ]],
    );
    let json = Json::Object(vec![
        ("key", Json::str(key)),
        ("exists", Json::Bool(true)),
        ("state", Json::str(state.as_str())),
        ("held", Json::Bool(state.is_held())),
        ("owner", owner.map_or(Json::Null, Json::str)),
        ("epoch", Json::Int(state.epoch().get())),
        ("expires_at", Json::time(expires_at)),
        ("ended", ended.map_or(Json::Null, Json::str)),
    ]);
    Ok(out.emit(&text, &json)?)
}
