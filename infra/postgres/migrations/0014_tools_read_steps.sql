-- The tool service reads a run's steps (streams/tool_calls.py, ``answered``): a call of an idempotent
-- tool keeps no tool_calls row, so a redelivered copy of one its run already applied is recognised from
-- the step the planner recorded as done, and dropped instead of dead-lettered as a forgery. Rows are
-- filtered by the agentstream_services policy of migration 0013, which names the tools role already.
GRANT SELECT ON steps TO agentstream_tools;
