"""When a node wants its next pass: what a room's pass returns instead of calling back into its owner.

A pass (the node reconciler's, and inside it the drainers' and the repair ladder's) returns the
seconds after which it wants the node reconciled again, or ``None`` when the next watch event or
sweep is enough. The rooms combine what their parts return with :func:`soonest`, and only the
runtime's worker turns the answer into a timer on the work queue: a room never reaches back into
the runtime in the middle of a pass, and a test reads what a pass wants from its result.

Every pass asks again for what it still needs, so the soonest request is the only one that matters:
a later one is asked again by the pass the soonest one brings.
"""

from __future__ import annotations

Again = float | None


def soonest(*delays: Again) -> Again:
    """The soonest of the delays asked for; ``None`` if none was."""
    asked = [d for d in delays if d is not None]
    return min(asked) if asked else None
