"""The server's request queue (grout.scheduler), without a model: the stop it honours."""
import asyncio

from grout.protocol import GenerationRequest
from grout.scheduler import Failed, Job, Scheduler


def test_a_job_submitted_after_the_server_began_stopping_fails_with_503():
    async def main():
        scheduler = Scheduler(lambda: "engine", lambda engine, job: None)
        queued = Job(GenerationRequest(kind="completion", prompt="a"), asyncio.get_running_loop())
        scheduler.submit(queued)                       # not served: start() never ran
        scheduler.cancel_all()
        # a request still being tokenized when the stop came submits afterwards
        late = Job(GenerationRequest(kind="completion", prompt="b"), asyncio.get_running_loop())
        scheduler.submit(late)
        return await asyncio.wait_for(asyncio.gather(queued.events.get(), late.events.get()),
                                      timeout=10)

    for event in asyncio.run(main()):
        assert isinstance(event, Failed)
        assert event.error.status == 503 and "shutting down" in event.error.message
