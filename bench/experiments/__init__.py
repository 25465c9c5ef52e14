"""Decision experiments: measurements made before choosing a design (faust-streaming for the planner,
Kafka transactions for its state), kept so that the decision can be checked again."""
