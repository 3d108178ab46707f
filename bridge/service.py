"""The one shape of the bridge's services (the publisher, the inbox, the listener, the
schedule runner), after River's: a loop, :meth:`Service.run`, that ends once its
`stopping` event is set; :meth:`Service.start` runs it as a task; :meth:`Service.stop`
asks it to finish and waits, cancelling it past the timeout. Each service also has a
`run_once()` returning what one step did, and `counts`, the events it saw
(arm_core.bridge.events)."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)


class Service:
    name = "service"
    # The running loop, once started.
    task: asyncio.Task[None] | None = None

    async def run(self, stopping: asyncio.Event) -> None:
        raise NotImplementedError

    def start(self) -> None:
        """Runs the loop as a task named after the service; returns at once."""
        self._stop_asked = asyncio.Event()
        self.task = asyncio.create_task(self.run(self._stop_asked), name=self.name)

    def ended(self) -> bool:
        """Started, and its loop has ended."""
        return self.task is not None and self.task.done()

    async def stop(self, grace: float) -> None:
        """Asks the loop to finish (what it has in hand first) and waits up to `grace`
        seconds; past it the loop is cancelled. A loop that ended with an exception is
        logged here."""
        task = self.task
        if task is None:
            return
        self._stop_asked.set()
        await asyncio.wait([task], timeout=grace)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        elif not task.cancelled() and task.exception() is not None:
            log.error("%s ended with %r", self.name, task.exception())
