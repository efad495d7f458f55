import shoal


def test_all_is_sorted_and_matches_exports() -> None:
    assert list(shoal.__all__) == sorted(shoal.__all__)
    exported = {name for name in dir(shoal) if not name.startswith("_")}
    modules = {"api", "app", "batch", "cli", "clock", "db", "demo", "errors", "hooks", "ingest"}
    modules |= {
        "cli_console",
        "cli_tasks",
        "extras",
        "logs",
        "metrics",
        "queue",
        "testing",
        "tracing",
    }
    assert set(shoal.__all__) == exported - modules
