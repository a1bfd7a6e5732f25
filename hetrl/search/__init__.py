"""Schedulers: HetRL's multi-level search, the exact ILP and the baselines, in one registry."""

from hetrl.search.base import SCHEDULERS, Budget, Scheduler, SearchResult, get_scheduler


def load_all() -> None:
    """Import every scheduler module so that each registers itself."""
    import importlib

    for module in ("sha", "baselines", "pools", "ilp"):
        try:
            importlib.import_module(f"hetrl.search.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != f"hetrl.search.{module}":
                raise


__all__ = ["SCHEDULERS", "Budget", "Scheduler", "SearchResult", "get_scheduler", "load_all"]
