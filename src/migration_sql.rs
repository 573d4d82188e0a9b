//! The text of the migrations under `migrations/`, compiled into the
//! crate, for tools that package the same SQL differently (the `leasehold`
//! command generates the PostgreSQL extension from it). Installing uses
//! [`crate::admin::MIGRATIONS`], Diesel's embedding of the same files.

/// The migrations, oldest first: directory name and `up.sql`. A unit test
/// checks that this list is exactly the `migrations/` directory.
pub const MIGRATION_SQL: &[(&str, &str)] = &[
    (
        "2026-12-01-000001_tables",
        include_str!("../migrations/2026-12-01-000001_tables/up.sql"),
    ),
    (
        "2026-12-01-000002_rules",
        include_str!("../migrations/2026-12-01-000002_rules/up.sql"),
    ),
    (
        "2026-12-01-000003_leases",
        include_str!("../migrations/2026-12-01-000003_leases/up.sql"),
    ),
    (
        "2026-12-01-000004_guards",
        include_str!("../migrations/2026-12-01-000004_guards/up.sql"),
    ),
    (
        "2026-12-01-000005_waiting",
        include_str!("../migrations/2026-12-01-000005_waiting/up.sql"),
    ),
    (
        "2026-12-01-000006_operator",
        include_str!("../migrations/2026-12-01-000006_operator/up.sql"),
    ),
    (
        "2026-12-01-000007_pruning",
        include_str!("../migrations/2026-12-01-000007_pruning/up.sql"),
    ),
    (
        "2026-12-01-000008_batches",
        include_str!("../migrations/2026-12-01-000008_batches/up.sql"),
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The list compiled in is exactly the migrations directory.
    #[test]
    fn the_list_is_the_migrations_directory() {
        let mut dirs: Vec<String> =
            std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
                .map(|entries| {
                    entries
                        .filter_map(Result::ok)
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
        dirs.sort();
        let listed: Vec<String> = MIGRATION_SQL.iter().map(|(d, _)| (*d).to_owned()).collect();
        assert_eq!(dirs, listed);
        for (dir, up) in MIGRATION_SQL {
            let path = format!("{}/migrations/{dir}/up.sql", env!("CARGO_MANIFEST_DIR"));
            assert_eq!(std::fs::read_to_string(path).ok().as_deref(), Some(*up));
        }
    }
}
