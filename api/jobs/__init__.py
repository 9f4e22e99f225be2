"""The API's side of jobs: the queue interface routes see, the response cache, long-poll and
stream following, queue statistics."""
