"""The unit tier: in the test process, no training, no subprocess (tests/conftest.py holds
it so). A package, so that a unit and an integration test file may share a name."""
