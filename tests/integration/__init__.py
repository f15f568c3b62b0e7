"""The integration tier: trainings, exports, studies, tools end to end, torchrun, Slurm. A
package, so that a unit and an integration test file may share a name."""
