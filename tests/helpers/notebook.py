"""A notebook cell as nbclient left it: what a notebook shows of it."""
import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Cell:
    def __init__(self, cell):
        self.source = cell.source
        self.count = cell.execution_count
        self.stdout = "".join(o.text for o in cell.outputs
                              if o.output_type == "stream" and o.name == "stdout")
        self.stderr = "".join(o.text for o in cell.outputs
                              if o.output_type == "stream" and o.name == "stderr")
        errors = [o for o in cell.outputs if o.output_type == "error"]
        self.ename = errors[0].ename if errors else None
        self.traceback = [_ANSI.sub("", line) for line in errors[0].traceback] if errors else []
        self.tb_text = "\n".join(self.traceback)
        results = [o for o in cell.outputs if o.output_type == "execute_result"]
        self.result = results[0].data.get("text/plain") if results else None

    def __repr__(self):
        return "<In[%s] %r: ename=%s stdout=%r stderr=%r result=%r>\n%s" % (
            self.count, self.source[:60], self.ename, self.stdout, self.stderr, self.result,
            self.tb_text)
