"""The rsync command line that filters what `sync_up` sends and `sync_down`
brings back, with rsync's include/exclude semantics.

Plain functions that build argv lists; nothing here runs them or imports Ray.
"""

from collections.abc import Sequence

_WILDCARDS = frozenset("*?[")


def rsync_command(
    source: str,
    target: str,
    *,
    include: Sequence[str],
    exclude: Sequence[str],
) -> list[str]:
    """The argv of an rsync that copies the contents of the directory `source`
    into the directory `target` (`-a`: recursive, keeping times and modes).

    Patterns are rsync's: every include comes before every exclude and, per
    path, the first pattern that matches decides. So that what users write
    does what they mean, each include is widened:

    - a name without wildcards also brings everything below it: `model`
      adds `model/**`, so include ['model', '*.py'] with exclude ['*'] copies
      the whole model package and the top-level .py files (rsync alone would
      stop at the `model` entry and drop model/'s other files);
    - a path with directories also includes those directories: `src/model`
      adds `src/`, or rsync would exclude `src` and never look inside.

    With any pattern, `--prune-empty-dirs` leaves out directories that end up
    empty: include ['*.pt', '*/'] with exclude ['*'] brings every .pt file at
    any depth with just the directories that lead to one. Without patterns,
    everything is copied, empty directories too.

    `source` gets a trailing `/` if it has none (rsync then copies its
    contents, not the directory itself). Both are local paths: transfers to and
    from the cluster go through Ray's own `sdk.rsync`, with the cluster's auth.
    """
    argv = ["rsync", "-a"]
    if include or exclude:
        argv.append("--prune-empty-dirs")
    argv += [f"--include={p}" for pattern in include for p in _widened_include(pattern)]
    argv += [f"--exclude={pattern}" for pattern in exclude]
    argv += [source if source.endswith("/") else f"{source}/", target]
    return argv


def _widened_include(pattern: str) -> list[str]:
    """`pattern`, the directories leading to it, and everything below a plain name."""
    anchor = "/" if pattern.startswith("/") else ""
    parts = [p for p in pattern.strip("/").split("/") if p]
    if not parts:
        return [pattern]
    parents = [anchor + "/".join(parts[:i]) + "/" for i in range(1, len(parts))]
    below = []
    if not _WILDCARDS & set(parts[-1]):
        below = [anchor + "/".join(parts) + "/**"]
    return [*parents, pattern, *below]
