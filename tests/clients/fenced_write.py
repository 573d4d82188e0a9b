"""A writer in another language, knowing nothing of leasehold but its SQL:
present a token (or not), then write to a fenced table.

    fenced_write.py URL TABLE KEY OWNER EPOCH|none VALUE

Prints "admitted", or "refused <constraint>" for a refusal by the fence;
anything else is an error (exit 1).
"""
import sys

import psycopg


def main() -> int:
    url, table, key, owner, epoch, value = sys.argv[1:7]
    try:
        with psycopg.connect(url) as conn:
            with conn.transaction():
                if epoch != "none":
                    conn.execute("SELECT lease.present(%s, %s, %s)", (key, owner, int(epoch)))
                conn.execute(
                    psycopg.sql.SQL("INSERT INTO {} VALUES (%s)").format(psycopg.sql.Identifier(table)),
                    (value,),
                )
    except psycopg.Error as error:
        name = error.diag.constraint_name or ""
        if name.startswith("lease_"):
            print("refused", name)
            return 0
        raise
    print("admitted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
