"""The steps a consumed record goes through, each one concern in a small object (as FastStream wraps a
handler in middlewares). The consumer loop (``streams/runtime/runner.py``) composes them once per
service, outermost first, and calls the chain once per record; a step not wanted is not in the chain:

==========================  ===============================================================  =============
step                        what it does                                                     installed
==========================  ===============================================================  =============
``StageTiming.record``      deliver, queue and done stages (``stages.py``)                   with a clock
``RecordMetrics``           queue wait, handling time by event type, duplicates              with metrics
``Decode``                  bytes to an event (waits out a schema lookup) or a dead letter   always
``StageTiming.decoded``     the decode stage                                                 with a clock
``Refuse``                  an event its topic does not carry: dead letter                   always
``Dedup``                   drop an event id handled recently; remember those handled        always
``RouteByRun``              mark an event off its run's partition or key                     route_by_run
``RecordTracing``           one span per handled record                                      with tracing
``Recover``                 retries, outages waited out, dead letter when it fails for good  always
— each attempt —
``AttemptMetrics``          handler errors                                                   with metrics
``Forward``                 forward a marked record to its run's partition, instead of:      route_by_run
``StageTiming.acked``       the ack stage                                                    with a clock
``Publish``                 a fresh ``Context``; done once its outputs are acknowledged      always
``StageTiming.handled``     the handle and to_send stages                                    with a clock
``CallHandler``             the service's handler (a claim check redeemed first)             always
==========================  ===============================================================  =============

``chain.py`` has what they share: the ``Delivery`` (one record on its way through, and what the steps
found out about it) and ``compose``. What the steps share besides (holding a partition through an
outage, sending a dead letter) is in ``streams/runtime/failures.py``.
"""
