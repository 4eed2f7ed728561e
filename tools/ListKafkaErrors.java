// Prints Apache Kafka's protocol error codes, one JSON object per line, for tools/generate_errors.py.
//
// Run in source-file mode with kafka-clients (and slf4j-api, which Errors logs through) on the
// class path:
//
//     java -cp kafka-clients.jar:slf4j-api.jar tools/ListKafkaErrors.java
//
// Each line: {"code": int, "name": str, "retriable": bool, "message": str|null, "exception": str|null}
// where "exception" is the simple name of the ApiException class Kafka maps the code to and
// "retriable" tells whether that class extends RetriableException. Lines are sorted by code.

import java.util.Arrays;
import java.util.Comparator;

import org.apache.kafka.common.errors.ApiException;
import org.apache.kafka.common.errors.RetriableException;
import org.apache.kafka.common.protocol.Errors;

public class ListKafkaErrors {
    public static void main(String[] args) {
        Errors[] errors = Errors.values();
        Arrays.sort(errors, Comparator.comparingInt(Errors::code));
        StringBuilder out = new StringBuilder();
        for (Errors error : errors) {
            ApiException exception = error.exception();
            out.append("{\"code\": ").append(error.code())
                .append(", \"name\": ").append(quote(error.name()))
                .append(", \"retriable\": ").append(exception instanceof RetriableException)
                .append(", \"message\": ").append(exception == null ? "null" : quote(exception.getMessage()))
                .append(", \"exception\": ")
                .append(exception == null ? "null" : quote(exception.getClass().getSimpleName()))
                .append("}\n");
        }
        System.out.print(out);
        System.out.flush();
    }

    private static String quote(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder b = new StringBuilder(s.length() + 2).append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (c < 0x20 || c > 0x7e) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
            }
        }
        return b.append('"').toString();
    }
}
