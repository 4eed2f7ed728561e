// A broker-side client telemetry receiver for tests/test_telemetry_broker.py: registered as a
// metric reporter (metric.reporters), it appends every client push the broker hands it to the
// file named by the broker property kcore.telemetry.capture.file, one line each:
// client instance id, terminating (true/false), content type, client id, payload in base64.
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.Base64;
import java.util.List;
import java.util.Map;

import org.apache.kafka.common.metrics.KafkaMetric;
import org.apache.kafka.common.metrics.MetricsReporter;
import org.apache.kafka.server.authorizer.AuthorizableRequestContext;
import org.apache.kafka.server.telemetry.ClientTelemetry;
import org.apache.kafka.server.telemetry.ClientTelemetryPayload;
import org.apache.kafka.server.telemetry.ClientTelemetryReceiver;

// ClientTelemetry: the receiver interface every Kafka 4.x broker takes (4.3 deprecates it for
// ClientTelemetryExporterProvider, which older brokers do not have).
@SuppressWarnings({"deprecation", "removal"})
public class TelemetryCapture implements MetricsReporter, ClientTelemetry {
    private volatile Path file;

    @Override
    public void configure(Map<String, ?> configs) {
        Object name = configs.get("kcore.telemetry.capture.file");
        if (name == null) {
            throw new IllegalArgumentException("kcore.telemetry.capture.file is not set");
        }
        file = Paths.get(name.toString());
    }

    @Override
    public void init(List<KafkaMetric> metrics) {}

    @Override
    public void metricChange(KafkaMetric metric) {}

    @Override
    public void metricRemoval(KafkaMetric metric) {}

    @Override
    public void close() {}

    @Override
    public ClientTelemetryReceiver clientReceiver() {
        return this::record;
    }

    private synchronized void record(AuthorizableRequestContext context, ClientTelemetryPayload payload) {
        ByteBuffer data = payload.data().duplicate();
        byte[] bytes = new byte[data.remaining()];
        data.get(bytes);
        String line = payload.clientInstanceId() + "\t" + payload.isTerminating() + "\t"
            + payload.contentType() + "\t" + context.clientId() + "\t"
            + Base64.getEncoder().encodeToString(bytes) + "\n";
        try {
            Files.write(file, line.getBytes(StandardCharsets.UTF_8),
                StandardOpenOption.CREATE, StandardOpenOption.APPEND);
        } catch (IOException e) {
            throw new RuntimeException(e);
        }
    }
}
